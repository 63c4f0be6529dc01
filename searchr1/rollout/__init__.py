"""searchr1.rollout: prompts in, multi-turn token-in / token-out trajectories out.

Reading order (follows the data path):
  config.py    RolloutConfig (section ``rollout``)
  sampling.py  SamplingParams, per-row seeded sampler, which log-probs are stored
  actions.py   <search> / <answer> parsing and turn stopping on decoded text
  episode.py   one trajectory's state machine (turns, observations, budgets, failures)
  search.py    searches in a thread pool with timeout and retries
  kv.py        KVBatch: independent streams sharing one KV cache (holes, compaction)
  hf.py        HFRolloutEngine (KV cache across turns, async search) and TurnSyncRolloutEngine
  single_turn.py  SingleTurnEngine: one reply, no search (the evaluation's baselines)
  engine.py    RolloutEngine: the interface (generate, update_weights with PolicyWeights, on_tokens)
  registry.py  ENGINES: rollout.engine name -> factory (hf, turn_sync, single_turn), build_engine
  steer.py     the HF engines' logits steering hook (constrained decoding, test workloads)
  types.py     Trajectory, Role
  records.py   trajectory_record: one JSON record per trajectory (answer from the model's own tokens)

Nothing is imported here, so ``import searchr1.rollout.config`` stays light.
"""
