# Untuned: double DQN on a toy gridworld written in torch. 32 parallel environments (agent and goal
# positions as long tensors, moves by clamp, episodes reset by torch.where when the goal is reached
# or after 12 moves); observations rendered as 2x16x16 one-hot images by index assignment. A replay
# buffer of preallocated tensors (states, actions, rewards, next states, done flags; 160 slots)
# filled in place by index assignment at wrapping indices under torch.no_grad (it wraps in the third
# step) and sampled by torch.randint. Epsilon-greedy actions by torch.rand comparisons and
# torch.where. An online 12-conv Q-network and a target network synced by
# load_state_dict(state_dict()) every 2 steps; Q(s,a) by gather, targets from the target net at the
# online net's argmax (both under no_grad), smooth_l1_loss, clip_grad_norm_, Adam. 6 steps, each two
# environment steps and one update on 96 sampled transitions.
import torch, torch.nn as nn, torch.nn.functional as F
from common import setup, report
policy = setup()
N, S, CAP, BS, NA, GAMMA = 32, 16, 160, 96, 4, 0.95
def qnet():
    return nn.Sequential(nn.Conv2d(2, 16, 3, padding=1), nn.ReLU(),
                         *[m for _ in range(7) for m in (nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())],
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64 * 2 * 2, 256), nn.ReLU(), nn.Linear(256, NA))
online, target = qnet(), qnet()
target.load_state_dict(online.state_dict())
opt = torch.optim.Adam(online.parameters(), lr=5e-4)
g = torch.Generator().manual_seed(11)
moves = torch.tensor([[0, 1], [0, -1], [1, 0], [-1, 0]])
buf_s = torch.zeros(CAP, 2, S, S); buf_s2 = torch.zeros(CAP, 2, S, S)
buf_a = torch.zeros(CAP, dtype=torch.long); buf_r = torch.zeros(CAP); buf_d = torch.zeros(CAP, dtype=torch.bool)
ptr, filled = 0, 0
def render(agent, goal):
    img = torch.zeros(agent.shape[0], 2, S, S); i = torch.arange(agent.shape[0])
    img[i, 0, agent[:, 0], agent[:, 1]] = 1.0; img[i, 1, goal[:, 0], goal[:, 1]] = 1.0
    return img
agent = torch.randint(0, S, (N, 2), generator=g); goal = torch.randint(0, S, (N, 2), generator=g)
t = torch.zeros(N, dtype=torch.long)
obs = render(agent, goal)
losses = []
for step in range(6):
    eps = max(0.1, 1.0 - 0.15 * step)
    for _ in range(2):                          # act and store
        with torch.no_grad():
            greedy = online(obs).argmax(1)
            rand_a = torch.randint(0, NA, (N,), generator=g)
            a = torch.where(torch.rand(N, generator=g) < eps, rand_a, greedy)
            old_d = (agent - goal).abs().sum(1)
            agent = (agent + moves[a]).clamp(0, S - 1); t += 1
            new_d = (agent - goal).abs().sum(1)
            reached = new_d == 0
            r = 0.1 * (old_d - new_d).float() + reached.float() - 0.01
            done = reached | (t >= 12)
            nxt = render(agent, goal)
            idx = (ptr + torch.arange(N)) % CAP
            buf_s[idx] = obs; buf_a[idx] = a; buf_r[idx] = r; buf_s2[idx] = nxt; buf_d[idx] = done
            ptr = (ptr + N) % CAP; filled = min(filled + N, CAP)
            fresh_a = torch.randint(0, S, (N, 2), generator=g); fresh_g = torch.randint(0, S, (N, 2), generator=g)
            agent = torch.where(done[:, None], fresh_a, agent); goal = torch.where(done[:, None], fresh_g, goal)
            t = torch.where(done, torch.zeros_like(t), t)
            obs = render(agent, goal)
    j = torch.randint(0, filled, (BS,), generator=g)
    s, a, r, s2, d = buf_s[j], buf_a[j], buf_r[j], buf_s2[j], buf_d[j]
    q = online(s).gather(1, a[:, None]).squeeze(1)
    with torch.no_grad():
        a_star = online(s2).argmax(1, keepdim=True)
        y = r + GAMMA * (~d).float() * target(s2).gather(1, a_star).squeeze(1)
    loss = F.smooth_l1_loss(q, y)
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(online.parameters(), 10.0)
    opt.step()
    if step % 2 == 1: target.load_state_dict(online.state_dict())
    losses += [loss.detach(), gn, q.detach().mean(), buf_r.sum()]
report(policy, [online, target], losses)
