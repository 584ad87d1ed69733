#!/bin/sh
# Run a long, quiet command (the Makefile's `pip install`, which compiles k3's C++ kernels for a minute or more and
# says nothing meanwhile) and say every SECONDS that it is still working, then how long it took; its own output and
# exit code pass through untouched, so a failed build shows pip's error and stops make. Checked by
# tests/wizard/test_first_hour.py on a slow stand-in command and a failing one.
# usage: sh scripts/ticker.sh SECONDS LABEL COMMAND [ARG...]
every=$1 label=$2
shift 2
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

# the ticker's sleep holds no output open: once the command is done, make and any pipe after it see the end at once
(while sleep "$every" >/dev/null 2>&1; do echo "k3: $label: $(elapsed) s so far"; done) &
ticker=$!
trap 'kill $ticker 2>/dev/null' EXIT
trap 'exit 130' INT TERM  # Ctrl-C reaches the command too (same process group); the ticker goes with the script

"$@"
status=$?
kill $ticker 2>/dev/null
if [ $status -eq 0 ]; then
	echo "k3: $label: done in $(elapsed) s"
else
	echo "k3: $label: FAILED after $(elapsed) s (exit $status): the output above says why" >&2
fi
exit $status
