"""What k3 tells a person about long work: progress meters with rate and ETA (meters.py), log lines on
stderr (logs.py), and the run report `k3 run` prints — speed, bytes read, peak RSS from the OS (run.py).

May import: k3core.units. Never the engine: a report is handed what it reports.
"""
