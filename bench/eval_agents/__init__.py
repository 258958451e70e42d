"""bench/eval_agents: does a budget stop the loop or the answer? (`python -m bench.eval_agents`).

Agent styles (agents.py) with their scripted model (policies.py) over one workload (workload.py,
data/), run through ragtoll in shadow and enforced mode (harness.py), scored against gold and an
oracle (scoring.py). A benchmark, not part of the test suite; docs/evaluations.md, "bench/eval_agents".
"""
