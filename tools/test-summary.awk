# The filter of tools/test.sh over cargo test's output: each test binary's start stamped with
# the time since the run began, everything passed through as it comes, and one closing line
# that sums every binary's "test result:" line. tests/examples.rs feeds it a known output.
function stamp(   t) { t = systime() - t0; return sprintf("[%02d:%02d]", int(t / 60), t % 60) }
BEGIN { t0 = systime(); bins = 0 }
/^ *Running / { bins++; print stamp() " " $0; fflush(); next }
/^ *Doc-tests / { bins++; print stamp() " " $0; fflush(); next }
/^test result: / {
    for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed;?$/) passed += $(i - 1)
        if ($(i) ~ /^failed;?$/) failed += $(i - 1)
        if ($(i) ~ /^ignored;?$/) ignored += $(i - 1)
    }
}
{ print; fflush() }
END {
    printf "tools/test.sh: %d passed, %d failed, %d ignored (test binaries: %d, %s)\n",
        passed, failed, ignored, bins, stamp()
}
