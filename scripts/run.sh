#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and starts the main job: `tfusion up`, the controller and
# the node agent of this machine with the embedded store. Extra arguments go to `tfusion up`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec build/src/cli/tfusion up "$@"
