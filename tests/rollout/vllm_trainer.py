"""A trainer's use of the vLLM engine, cut down to what the kill tests need (tests/rollout/test_vllm_engine.py):
SmolLM2 in float32, the engine built as the trainer builds it, then one phase, in which it waits to be killed.

    python vllm_trainer.py rest         the engine built on a worker thread that then ends; one rollout; idle
    python vllm_trainer.py loading      the engine built on the main thread (killed while its server loads)
    python vllm_trainer.py reloading    the engine built, then the policy's weights synced again and again

It prints ``ready`` once the engine generated (rest); ``synced N`` after each weight sync, and ``reload in
flight`` when the server has had a reload request for 0.5 s without answering (reloading).
"""

from __future__ import annotations

import sys
import threading

from searchr1.config import load_config
from searchr1.models import load_model, load_tokenizer, plain_state_dict, resolve_model
from searchr1.rollout.engine import PolicyWeights
from searchr1.rollout.registry import build_engine
from searchr1.rollout.sampling import SamplingParams


def main(phase: str) -> None:
    folder = str(resolve_model("smollm2-135m-instruct"))
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.dtype=float32", "rollout.max_batch_rows=4",
                             "rollout.max_context=1024"])  # fmt: skip
    tokenizer, model = load_tokenizer(folder), load_model(folder, dtype="float32")
    engines = []

    def build() -> None:
        engines.append(build_engine(cfg, model, tokenizer, None, name="vllm"))

    if phase == "rest":
        worker = threading.Thread(target=build, name="engine-builder")
        worker.start()
        worker.join()  # the thread that started the server has ended
        engine = engines[0]
        prompt = tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
        (traj,) = engine.generate([prompt], sampling=SamplingParams(greedy=True, max_turn_tokens=4), seed=0)
        assert traj.num_generated > 0
        print("ready", flush=True)
        sys.stdin.read()  # until killed
    elif phase == "loading":
        build()
        print("the server loaded before the kill", flush=True)
        sys.stdin.read()
    elif phase == "reloading":
        build()
        engine = engines[0]
        reload_weights = engine.client.reload_weights

        def told(folder: str) -> None:
            """The reload, and ``reload in flight`` once the server has had it for 0.5 s without answering."""
            answered = threading.Event()
            threading.Thread(
                target=lambda: answered.wait(0.5) or print("reload in flight", flush=True), daemon=True
            ).start()
            try:
                reload_weights(folder)
            finally:
                answered.set()

        engine.client.reload_weights = told
        weights = PolicyWeights(step=1, state_dict=plain_state_dict(model))
        for n in range(1, 10_000):
            engine.update_weights(weights)
            print(f"synced {n}", flush=True)
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    main(sys.argv[1])
