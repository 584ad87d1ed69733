"""Fuzzing profiles: `make test` runs each property a bounded number of times ("ci"); `make fuzz` runs them
long ("fuzz", K3_FUZZ_EXAMPLES examples each). A crash is any exception that is not a K3Error; every input
that once crashed is kept in tests/fuzz/corpus/<target>/ and replayed by test_corpus.py."""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=int(os.environ.get("K3_FUZZ_EXAMPLES", "40")), deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                          derandomize=True)
settings.register_profile("fuzz", max_examples=int(os.environ.get("K3_FUZZ_EXAMPLES", "20000")), deadline=None,
                          suppress_health_check=list(HealthCheck), print_blob=True)
settings.load_profile(os.environ.get("K3_FUZZ_PROFILE", "ci"))
