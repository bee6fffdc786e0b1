#!/usr/bin/env bash
# Make the trees that the device part `ab` of device_run_hot.sh compares side by side (one commit per tree):
#   bash results/h200/device/ab_trees.sh NAME=REF [NAME=REF ...]      e.g. main=main dot=wip/one-dot-3xtf32
# Each tree is `git archive` of REF's package code and tests (not its results: results/, or profiles/h200 and
# profiles/cpu in a commit from before they moved there) in the ignored .abtrees/NAME/, with REF's short commit
# id in .abtrees/NAME/COMMIT. Carry ".abtrees" (and ".whl") to the device.
# Every spec is checked before .abtrees is replaced; a bad one (not NAME=REF, a name that is not a plain word, a
# repeated name, a ref that is no commit) exits 2 and leaves .abtrees as it was.
set -eu
declare -A commits=()
names=()
for spec in "$@"; do
  name=${spec%%=*}; ref=${spec#*=}
  if [[ $name == "$spec" || ! $name =~ ^[A-Za-z0-9_-]+$ || -z $ref ]]; then
    echo "ab_trees: want NAME=REF with NAME of letters, digits, - or _, got '$spec'" >&2; exit 2
  fi
  if [[ -n ${commits[$name]:-} ]]; then echo "ab_trees: the name '$name' is given twice" >&2; exit 2; fi
  if ! commits[$name]=$(git rev-parse --verify --quiet --short "$ref^{commit}"); then
    echo "ab_trees: '$ref' (for $name) is not a commit of this repository" >&2; exit 2
  fi
  names+=("$name")
done
(( ${#names[@]} )) || { echo "ab_trees: give at least one NAME=REF" >&2; exit 2; }
rm -rf .abtrees; mkdir -p .abtrees
for name in "${names[@]}"; do
  mkdir -p ".abtrees/$name"
  git archive "${commits[$name]}" guards kernels trainer profiles tests pyproject.toml ':!profiles/h200' ':!profiles/cpu' \
    | tar -x -C ".abtrees/$name"
  echo "${commits[$name]}" > ".abtrees/$name/COMMIT"
  echo "$name: ${commits[$name]} ($(du -sh ".abtrees/$name" | cut -f1))"
done
