"""The trace simulator: one replay loop (replay) over memory policies (paged, contiguous).

`simulator.simulate` runs a trace through one policy and returns a SimResult;
`simulator.simulate_workload` runs several in parallel processes.
"""
