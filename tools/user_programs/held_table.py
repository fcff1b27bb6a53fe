"""held_table.py OUTDIR: the held-memory audit's table from held_sweep.sh's outputs."""
import glob, os, re, sys
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "out_held")
M = 2**20
def read(p):
    try: txt = open(p).read()
    except FileNotFoundError: return None
    d = {"sig": [l for l in txt.splitlines() if l.startswith(("loss", "params"))]}
    m = re.search(r"^allocated peak (\d+) end (\d+)", txt, re.M)
    if m: d["peak"], d["end"] = int(m[1]), int(m[2])
    m = re.search(r"^allocated after_collect (\d+)", txt, re.M)
    if m: d["coll"] = int(m[1])
    m = re.search(r"^peak \d+ evictions (\d+)", txt, re.M)
    if m: d["ev"] = int(m[1])
    d["held"] = [l[5:] for l in txt.splitlines() if l.startswith("held ")]
    return d
progs = sorted({os.path.basename(p).split(".")[0] for p in glob.glob(f"{out}/*.none.txt")})
rows, flagged = [], []
for P in progs:
    plain, none = read(f"{out}/{P}.plain.txt"), read(f"{out}/{P}.none.txt")
    if not none or "peak" not in none:
        rows.append(f"| {P} | none failed | | | | | |"); continue
    cells, notes, worst = [], [], 1.0
    for pol in ("recompute", "swap", "hybrid"):
        d = read(f"{out}/{P}.{pol}.txt")
        if not d or "peak" not in d:
            cells.append("ERROR"); notes.append(f"{pol} failed"); continue
        r = d["peak"] / none["peak"]
        worst = max(worst, r)
        c = f"{d['peak']/M:.2f}/{d['end']/M:.2f}"
        if "coll" in d and d["coll"] != d["end"]: c += f" (collect {d['coll']/M:.2f})"
        cells.append(c)
        ref = plain if plain and plain["sig"] else none
        if d["sig"] != ref["sig"]: notes.append(f"{pol} DIFFERS from {'plain' if ref is plain else 'none'}")
        if d.get("ev"): notes.append(f"{pol} {d['ev']} evictions")
        if d["peak"] - none["peak"] > min(0.05 * none["peak"], M) or d["end"] - none["end"] > 16 << 10:
            flagged.append((P, pol, d["peak"] - none["peak"], d["end"] - none["end"], d.get("coll"), d["held"]))
    if plain and none["sig"] != plain["sig"]: notes.append("none DIFFERS from plain")
    if not plain: notes.append("plain not run: compared with none")
    elif not plain["sig"]: notes.append("plain failed")
    rows.append(f"| {P} | {none['peak']/M:.2f}/{none['end']/M:.2f} | " + " | ".join(cells) + f" | {worst:.3f} | {'; '.join(notes)} |")
print("| program | none peak/end | recompute peak/end | swap peak/end | hybrid peak/end | worst peak ratio | notes |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
print(f"\n{len(progs)} programs; flagged (peak > none by >5% or >1 MiB, or end > none):\n")
for P, pol, dp, de, coll, held in flagged:
    print(f"- {P} {pol}: peak +{dp/M:.2f} MiB, end +{de/M:.2f} MiB" + (f", after collect {coll/M:.2f} MiB" if coll is not None else ""))
