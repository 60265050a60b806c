# shellcheck shell=bash
# fuzz-options.sh - sourced by fuzz-run.sh, campaign.sh and corpus-merge.sh.
# fuzz_names DIR [NAME...]: FUZZ_NAMES, the NAMEs given, else every
# harness with a corpus in DIR/corpus/.
fuzz_names() {
  local d=$1
  shift
  FUZZ_NAMES=("$@")
  if ((${#FUZZ_NAMES[@]} == 0)); then
    for d in "$d"/corpus/*/; do FUZZ_NAMES+=("$(basename "$d")"); done
  fi
}

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
