"""Break a saved IPPO Combat run's evaluation games into win / wipe-out loss / timeout.

usage: PYTHONPATH=. python notes/combat_outcomes.py RUN_DIR [episodes] [seed]
Plays the run's own evaluation (sampled actions, seed 0 unless given) and prints, per outcome,
the count, mean length, agents' and bots' hp left, and how many timeouts never saw a bot.
"""

import sys

import numpy as np

from rlpipe.envs.combat import CombatVectorEnv
from rlpipe.training.multiagent import load_team_policy

run_dir = sys.argv[1]
episodes = int(sys.argv[2]) if len(sys.argv) > 2 else 200
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
policy, greedy, meta, _ = load_team_policy(run_dir, seed=seed)
cfg = meta["config"]
rules = {k: cfg[k] for k in ("team_size", "n_opponents", "grid", "max_steps", "cooldown", "win_reward", "step_reward")}
n = min(episodes, 100)
quota = np.array([episodes // n + (i < episodes % n) for i in range(n)])
envs = CombatVectorEnv(n, **rules)
obs, _ = envs.reset(seed=seed)
g = envs.games
length = np.zeros(n, np.int64)
seen = lambda o: (o.reshape(n, rules["team_size"], 6, 25)[:, :, 0] < 0).any((1, 2))  # noqa: E731
saw = seen(obs)  # some agent has seen a bot this episode
played = np.zeros(n, np.int64)
rows = []  # (outcome, length, agents hp, bots hp, saw)
while (played < quota).any():
    obs, _, term, trunc, info = envs.step(policy(obs))
    saw |= seen(obs)
    length += info["valid"]
    done = term | trunc
    for i in np.flatnonzero(done & (played < quota)):
        outcome = "win" if info["win"][i] else ("timeout" if trunc[i] else "wipeout")
        rows.append((outcome, length[i], g.hp[i, g.agents].clip(0).sum(), g.hp[i, g.bots].clip(0).sum(), saw[i]))
        played[i] += 1
    length[done], saw[done] = 0, False
print(f"{run_dir}: {len(rows)} games, {'greedy' if greedy else 'sampled'} actions, seed {seed}")
for outcome in ("win", "wipeout", "timeout"):
    r = [x for x in rows if x[0] == outcome]
    if not r:
        print(f"  {outcome:8s} 0")
        continue
    a = np.array([x[1:] for x in r], float)
    print(f"  {outcome:8s} {len(r):4d} ({len(r)/len(rows):.3f})  len {a[:,0].mean():5.1f}  agents hp {a[:,1].mean():.2f}"
          f"  bots hp {a[:,2].mean():.2f}  never saw a bot {int((a[:,3]==0).sum())}")
