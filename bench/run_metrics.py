"""Reading a run directory's metrics.db (track/metrics_store.h) for the benchmarks."""
import sqlite3


def series(db, name):
    """Every (rank, step, value) of metric `name`, read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(
            "select m.rank, m.step, m.value from metrics m join names n on m.name_id = n.id "
            "where n.name = ?", (name,)).fetchall()
    finally:
        con.close()


def slowest_rank_step_times(db, ranks=2):
    """[(step, the slowest rank's step_time_s)] for the steps every one of `ranks` logged."""
    per_step = {}
    for rank, step, value in series(db, "step_time_s"):
        per_step.setdefault(step, {})[rank] = value
    return [(s, max(r.values())) for s, r in sorted(per_step.items()) if len(r) == ranks]
