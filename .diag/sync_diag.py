import sys, time, torch
use = sys.argv[1] == "pyalloc"
if use:
    import pyalloc; pyalloc.install(device="cuda")
def q(tag, side): print(f"{'pyalloc' if use else 'native '} {tag:28s} side_done={side.query()} t={time.perf_counter()-T:.4f}", flush=True)
side = torch.cuda.Stream()
y = torch.ones(1 << 20, device="cuda"); torch.cuda.synchronize()
T = time.perf_counter()
with torch.cuda.stream(side):
    torch.cuda._sleep(2_000_000_000)
q("after _sleep launch", side)
with torch.cuda.stream(side):
    y.mul_(2)
q("after y.mul_ on side", side)
y.record_stream(side); q("after record_stream", side)
del y; q("after del y", side)
if use: pyalloc.memory_stats(); q("after memory_stats", side)
z = torch.empty(1 << 20, device="cuda"); q("after z alloc (cached)", side)
w = torch.empty(300 << 20, dtype=torch.uint8, device="cuda"); q("after 300MiB alloc (new segment)", side)
torch.cuda.synchronize(); q("after synchronize", side)
