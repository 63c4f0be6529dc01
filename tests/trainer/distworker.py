"""Worker of the torch.distributed equivalence test: one policy update over a fixed global batch,
in one process or split over ranks (gloo), exactly as ``RLTrainer`` runs it."""

from __future__ import annotations

import os
from pathlib import Path

import torch

GROUPS = 4
GROUP_SIZE = 2


def fixed_batch(vocab: int, seed: int = 0):
    """A global batch of trajectories (prompt, generated and observation tokens), with rewards."""
    from searchr1.rollout.types import Role, Trajectory

    g = torch.Generator().manual_seed(seed)
    trajs, scores, groups = [], [], []
    for group in range(GROUPS):
        prompt = torch.randint(5, vocab, (4 + group,), generator=g).tolist()
        for _ in range(GROUP_SIZE):
            gen1 = int(torch.randint(3, 9, (1,), generator=g))
            gen2 = int(torch.randint(2, 6, (1,), generator=g))
            roles = [Role.GENERATED] * gen1 + [Role.OBSERVATION] * 3 + [Role.GENERATED] * gen2
            ids = torch.randint(5, vocab, (len(roles),), generator=g).tolist()
            trajs.append(Trajectory(prompt_ids=prompt, response_ids=ids, roles=[int(r) for r in roles],
                                    logprobs=[0.0] * len(roles)))  # fmt: skip
            scores.append(float(torch.rand((), generator=g)))
            groups.append(group)
    return trajs, scores, groups


def run(rank: int, world: int, model_dir: str, out: str, port: int, strategy: str = "ddp") -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if world > 1:
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
        )
    else:
        os.environ["WORLD_SIZE"] = "1"
    from searchr1.algorithms.advantages import compute_advantages
    from searchr1.algorithms.config import AlgorithmConfig
    from searchr1.models import load_model
    from searchr1.trainer.distributed import full_state_dict, init_distributed, wrap_model
    from searchr1.trainer.experience import build_experience, gather_experience
    from searchr1.trainer.policy import PolicyLogprobs
    from searchr1.trainer.update import UpdateSettings, run_update

    device = torch.device("cpu")
    info = init_distributed(device)
    model = load_model(model_dir)
    reference = load_model(model_dir)
    trajs, scores, groups = fixed_batch(model.config.vocab_size)
    algo = AlgorithmConfig(advantage="reinforce_plus_plus", use_kl_loss=True, kl_coef=0.1, entropy_coef=0.01)
    per_rank = GROUPS // world
    rows = [i for i, gid in enumerate(groups) if rank * per_rank <= gid < (rank + 1) * per_rank]
    exp = build_experience([trajs[i] for i in rows], [scores[i] for i in rows], [groups[i] for i in rows], 0)
    with torch.no_grad():
        exp.old_logprobs, _ = PolicyLogprobs(model)(
            exp.input_ids, exp.attention_mask, target_mask=exp.train_mask
        )
        exp.ref_logprobs, _ = PolicyLogprobs(reference)(
            exp.input_ids, exp.attention_mask, target_mask=exp.train_mask
        )
    exp = gather_experience(exp, info)
    exp.advantages, exp.returns = compute_advantages(
        exp.scores, exp.train_mask, algo, group_ids=exp.group_ids
    )
    actor = wrap_model(PolicyLogprobs(model), info, strategy, device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    settings = UpdateSettings(ppo_epochs=2, num_mini_batches=2, micro_batch_size=2, micro_batch_tokens=0,
                              grad_clip=1.0, temperature=1.0, update_actor=True, update_critic=False, seed=3)  # fmt: skip
    metrics, skipped = run_update(exp, actor=actor, actor_optimizer=optimizer, critic=None, critic_optimizer=None,
                                  algo=algo, settings=settings, info=info, device=device)  # fmt: skip
    state = full_state_dict(model, info)
    if info.is_main:
        torch.save({"metrics": metrics, "skipped": skipped, "state": state}, Path(out))
    if info.enabled:
        torch.distributed.destroy_process_group()
