"""`k3 tune`: the fastest exact settings for this machine, measured on the user's own model and disk. knobs.py says
what can matter, search.py searches (coordinate descent, or a grid to check it), trial.py runs each setting in a
process of its own and checks its ids, run.py puts them together; the result is a plan/tuned.py `Tuned`, which the
saved profile keeps and every run of the profile's model uses."""
