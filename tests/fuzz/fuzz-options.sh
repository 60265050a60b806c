# shellcheck shell=bash
# fuzz-options.sh - sourced by fuzz-run.sh and campaign.sh.
# fuzz_options DIR NAME: FUZZ_OPTS, the libFuzzer options of harness NAME
# from DIR/NAME.options (one a line, '#' comments, @HERE@ is DIR), or none.
fuzz_options() {
  local o
  FUZZ_OPTS=()
  [[ -f $1/$2.options ]] || return 0
  while read -r o; do
    [[ -z $o || $o == \#* ]] && continue
    FUZZ_OPTS+=("${o//@HERE@/$1}")
  done <"$1/$2.options"
}
