"""The learning demo: RL with outcome rewards teaches SmolLM2-135M-Instruct to search, on a CPU.

``settings`` (what a demo run is), ``runs`` (worlds, evaluations, training), ``summary`` (the numbers of
``summary.json``), ``console`` (what is printed) and ``cli`` (``searchr1 demo``). Nothing heavy is
imported here, so ``searchr1 --help`` stays light.
"""
