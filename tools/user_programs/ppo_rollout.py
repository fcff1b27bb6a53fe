# Untuned: PPO on a toy environment written in torch. 16 parallel point-mass environments (position,
# velocity, goal; the state updated by tensor ops, episodes reset by torch.where when the goal is
# reached or after 40 steps); the observation is rendered as a 2x16x16 image (Gaussian blobs of the
# mass and the goal) plus the velocity. A 9-layer conv actor-critic (shared trunk, Categorical policy head
# over 5 actions, value head). Each iteration collects a 64-step rollout under torch.no_grad
# (Categorical.sample -> torch.multinomial, log_prob), computes GAE by a reverse Python loop,
# normalises advantages, then runs 4 epochs of shuffled minibatches (torch.randperm, index_select)
# with the clipped surrogate objective, clipped value loss and an entropy bonus, clip_grad_norm_,
# Adam. 2 iterations.
import torch, torch.nn as nn, torch.nn.functional as F
from torch.distributions import Categorical
from common import setup, report
policy = setup()
torch.use_deterministic_algorithms(True)
NE, NS, R, A = 16, 64, 16, 5
EPOCHS, MB, CLIP, GAMMA, LAM = 4, 64, 0.2, 0.99, 0.95
MOVES = torch.tensor([[0., 0.], [1., 0.], [-1., 0.], [0., 1.], [0., -1.]])
grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, R), torch.linspace(-1, 1, R), indexing="ij"), -1)
class Env:
    def __init__(s, g):
        s.g = g
        s.pos = torch.rand(NE, 2, generator=g) * 2 - 1; s.vel = torch.zeros(NE, 2)
        s.goal = torch.rand(NE, 2, generator=g) * 2 - 1; s.t = torch.zeros(NE)
    def obs(s):
        def blob(p): return torch.exp(-((grid[None] - p[:, None, None]) ** 2).sum(-1) / 0.05)
        return torch.stack([blob(s.pos), blob(s.goal)], 1), s.vel.clone()
    def step(s, a):
        s.vel = 0.8 * s.vel + 0.05 * MOVES[a]
        s.pos = (s.pos + s.vel).clamp(-1, 1)
        s.t += 1
        dist = (s.pos - s.goal).norm(dim=1)
        reached = dist < 0.15
        rew = -dist + 5.0 * reached.float()
        done = reached | (s.t >= 40)
        newpos = torch.rand(NE, 2, generator=s.g) * 2 - 1; newgoal = torch.rand(NE, 2, generator=s.g) * 2 - 1
        s.pos = torch.where(done[:, None], newpos, s.pos); s.goal = torch.where(done[:, None], newgoal, s.goal)
        s.vel = torch.where(done[:, None], torch.zeros_like(s.vel), s.vel); s.t = torch.where(done, torch.zeros_like(s.t), s.t)
        return rew, done.float()
class ActorCritic(nn.Module):
    def __init__(s):
        super().__init__()
        s.conv = nn.Sequential(nn.Conv2d(2, 24, 3, padding=1), nn.ReLU(), nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(), nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(), nn.Conv2d(24, 24, 3, padding=1), nn.ReLU(),
                               nn.MaxPool2d(2), nn.Conv2d(24, 48, 3, padding=1), nn.ReLU(), nn.Conv2d(48, 48, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(48, 48, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        s.fc = nn.Sequential(nn.Linear(48 * 2 * 2 + 2, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh())
        s.pi = nn.Linear(256, A); s.v = nn.Linear(256, 1)
    def forward(s, img, vel):
        h = s.fc(torch.cat([s.conv(img).flatten(1), vel * 10], 1))
        return s.pi(h), s.v(h).squeeze(-1)
model = ActorCritic()
opt = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5)
g = torch.Generator().manual_seed(1)
env = Env(g)
losses = []
for it in range(2):
    imgs, vels, acts, logps, vals, rews, dones = [], [], [], [], [], [], []
    with torch.no_grad():
        for t in range(NS):
            img, vel = env.obs()
            logits, v = model(img, vel)
            dist = Categorical(logits=logits)
            a = dist.sample()
            r, d = env.step(a)
            imgs.append(img); vels.append(vel); acts.append(a); logps.append(dist.log_prob(a)); vals.append(v)
            rews.append(r); dones.append(d)
        img, vel = env.obs()
        _, last_v = model(img, vel)
    adv = torch.zeros(NS, NE); gae = torch.zeros(NE)
    for t in reversed(range(NS)):
        nv = last_v if t == NS - 1 else vals[t + 1]
        nonterm = 1.0 - dones[t]
        delta = rews[t] + GAMMA * nv * nonterm - vals[t]
        gae = delta + GAMMA * LAM * nonterm * gae
        adv[t] = gae
    vals_t = torch.stack(vals); ret = adv + vals_t
    b_img = torch.stack(imgs).flatten(0, 1); b_vel = torch.stack(vels).flatten(0, 1)
    b_act = torch.stack(acts).flatten(); b_logp = torch.stack(logps).flatten()
    b_adv = adv.flatten(); b_ret = ret.flatten(); b_val = vals_t.flatten()
    b_adv = (b_adv - b_adv.mean()) / (b_adv.std() + 1e-8)
    losses += [torch.stack(rews).sum(), b_adv.abs().sum(), b_logp.sum()]
    for ep in range(EPOCHS):
        perm = torch.randperm(NE * NS, generator=g)
        for k in range(0, NE * NS, MB):
            idx = perm[k:k + MB]
            logits, v = model(b_img.index_select(0, idx), b_vel.index_select(0, idx))
            dist = Categorical(logits=logits)
            newlogp = dist.log_prob(b_act.index_select(0, idx))
            ratio = (newlogp - b_logp.index_select(0, idx)).exp()
            mb_adv = b_adv.index_select(0, idx)
            pg = torch.max(-mb_adv * ratio, -mb_adv * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
            old_v = b_val.index_select(0, idx); mb_ret = b_ret.index_select(0, idx)
            v_clip = old_v + (v - old_v).clamp(-CLIP, CLIP)
            vloss = 0.5 * torch.max((v - mb_ret) ** 2, (v_clip - mb_ret) ** 2).mean()
            ent = dist.entropy().mean()
            loss = pg + 0.5 * vloss - 0.01 * ent
            opt.zero_grad()
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            with torch.no_grad(): kl = (b_logp.index_select(0, idx) - newlogp).mean()
            losses += [loss.detach(), gn, kl]
report(policy, [model], losses)
