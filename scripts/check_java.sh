#!/usr/bin/env bash
# Fail with a clear message when Java 17+ (needed by pyspark 4) is missing.
set -euo pipefail
need=17
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "error: Java not found. pyspark 4 needs Java ${need}+." >&2
  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-${need}-jre-headless   (or set JAVA_HOME)" >&2
  exit 1
fi
version=$("$java_bin" -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\)\(\.\([0-9]*\)\)\{0,1\}.*/\1 \3/p' | head -1)
major=${version%% *}
if [ "$major" = "1" ]; then major=${version##* }; fi
if [ -z "$major" ] || [ "$major" -lt "$need" ]; then
  echo "error: Java ${major:-unknown} found at $(command -v "$java_bin"), but pyspark 4 needs Java ${need}+." >&2
  echo "       Debian/Ubuntu: sudo apt-get install -y openjdk-${need}-jre-headless, then set JAVA_HOME" >&2
  exit 1
fi
echo "java ${major}: ok"
