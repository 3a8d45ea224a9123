"""Files and the command line: what crosses the boundary to users and other tools.

    snapshot, restore    CONTRACT.md's snapshot export and exact restore (restore_host:
                         the swap host pool; recompute: K/V and logits from the tokens;
                         restore_notes: what a restore tells besides the state)
    scenario             scenario files: parse, check, run (with `expect` checks)
    contiguous_mirror    a scenario's optional contiguous arena, serving its requests alongside
    json_input           one bounded JSON decoder and a typed field reader
    export               CSV, Parquet, zip, PNG and SVG exports
    cli, simulate_cli    `python -m backend run | simulate`

May import: engine, lab and everything below them; never views or sessions.
Entry points: `cli.main`, `snapshot.export_snapshot`, `restore.restore_engine`.
"""
