# Sourced by bench/run.sh and bench/profile.sh (it needs their `cli`
# function: redis-cli on the benchmarked server).
#
# pipe_keys TEMPLATE COUNT REPEAT: send TEMPLATE (words; {I} becomes the
# key number, zero-padded to 12 digits like __rand_int__) for I in
# 0..COUNT-1, each REPEAT times in a row, through redis-cli --pipe.
pipe_keys() {
    local template=$1 count=$2 repeat=$3 out
    out=$(awk -v t="$template" -v n="$count" -v r="$repeat" 'BEGIN {
        w = split(t, words, " ")
        for (i = 0; i < n; i++) {
            id = sprintf("%012d", i)
            s = "*" w "\r\n"
            for (j = 1; j <= w; j++) {
                a = words[j]
                # index/substr: mawk is very slow with gsub on /\{I\}/.
                while ((p = index(a, "{I}")) > 0)
                    a = substr(a, 1, p - 1) id substr(a, p + 3)
                s = s "$" length(a) "\r\n" a "\r\n"
            }
            for (k = 0; k < r; k++) printf "%s", s
        }
    }' | cli --pipe 2>&1)
    if ! grep -q "errors: 0," <<<"$out"; then
        echo "bench: pipe of '$template' failed: $out" >&2
        exit 1
    fi
}
