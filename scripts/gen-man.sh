#!/bin/sh
# gen-man.sh WAFER OUTDIR: man pages from the binary's own help (help2man is not in a plain Debian 12
# install; the --help texts stay the one source of truth): OUTDIR/wafer.1 from `wafer --help` and
# OUTDIR/wafer-CMD.1 from `wafer CMD --help` for each command `wafer --help` lists. The help text is kept
# as written (preformatted); SOURCE_DATE_EPOCH, when set, dates the pages (reproducible builds).
set -eu
bin=$1
out=$2
mkdir -p "$out"
version=$("$bin" --version | sed 's/^wafer //')
date=$(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%d)

# roff-escape preformatted text: backslashes, hyphens (so options copy as ASCII), leading . and '
esc() {
    sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e 's/^\./\\\&./' -e "s/^'/\\\\\\&'/"
}

page() { # page NAME SUMMARY HELP-COMMAND...
    name=$1
    summary=$2
    shift 2
    upper=$(echo "$name" | tr 'a-z' 'A-Z')
    {
        echo ".TH $upper 1 \"$date\" \"wafer $version\" \"wafer manual\""
        echo ".SH NAME"
        echo "$name \\- $summary" | sed 's/\([^\\]\)-/\1\\-/g'
        echo ".SH DESCRIPTION"
        echo ".nf"
        "$@" | esc
        echo ".fi"
        echo ".SH SEE ALSO"
        if [ "$name" = wafer ]; then
            echo "$commands" | sed 's/^\(.*\)$/.BR wafer-\1 (1)/'
        else
            echo ".BR wafer (1)"
        fi
        echo ".SH VERSION"
        echo "wafer $version"
    } >"$out/$name.1"
}

# the command table of `wafer --help`: "  NAME   summary" lines after "commands:"
table=$("$bin" --help | awk '/^commands:/ {on=1; next} on && /^  [a-z]/ && !/^  --/ {print}')
commands=$(echo "$table" | awk '{print $1}')
page wafer "a fast LLM inference engine and OpenAI-compatible server for GGUF models" "$bin" --help
echo "$table" | while read -r cmd summary; do
    page "wafer-$cmd" "$summary" "$bin" "$cmd" --help
done
echo "man pages: $(ls "$out" | wc -l) in $out"
