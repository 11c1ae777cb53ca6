#!/bin/sh
# Runs every test binary given, then prints one line: "N passed, N failed".
# Tests are not benchmarks: passive OpenMP waiting keeps them fast on a busy machine, where
# spinning threads would wait on descheduled partners.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
passed=0; failed=0; broken=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -n 40
    line=$(printf '%s\n' "$out" | grep -E '^[a-z_]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    p=$(printf '%s' "$line" | sed -n 's/.*: \([0-9]*\) passed.*/\1/p'); f=$(printf '%s' "$line" | sed -n 's/.* \([0-9]*\) failed/\1/p')
    # A binary that crashed, or exited non-zero while reporting no failure, is a failure itself.
    if [ -z "$line" ] || { [ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ]; }; then
        echo "$t: exited $rc without a clean summary"; broken=$((broken + 1))
    fi
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0}))
done
failed=$((failed + broken))
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
