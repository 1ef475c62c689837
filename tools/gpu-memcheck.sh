#!/usr/bin/env bash
# compute-sanitizer memcheck with --leak-check full, for tools/gpu-check.sh, that does not
# count what the CUDA context keeps for the life of the process on purpose
# (kernels/cuda/context.h: the Context is never destroyed, so its cuBLAS and cuDNN
# handles live on, and PersistentBuffer's buffers are never freed so that a captured
# CUDA graph's addresses stay valid). memcheck reports each as "Leaked ... bytes" with
# Context::cublas(), Context::cudnn() or PersistentBuffer::get in its allocation
# backtrace. Exit 0 when every error it reports is such a leak, else memcheck's own
# exit code (an access error, or any other leak, still fails).
#
#   tools/gpu-memcheck.sh PROGRAM [ARGS...]
set -uo pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
compute-sanitizer --tool memcheck --leak-check full --error-exitcode 3 --print-limit 100000 "$@" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 3 ] || exit $rc
errors=$(grep -m1 -oE 'ERROR SUMMARY: [0-9]+' "$out" | grep -oE '[0-9]+$')
# A leak report: "Leaked N bytes at ADDR", then its backtrace up to the next "=========" blank.
by_design=$(awk '/Leaked [0-9,]+ bytes/ {inleak = 1; found = 0; next}
                 inleak && /PersistentBuffer::get|cuda::Context::(cublas|cudnn)\(\)/ {found = 1}
                 inleak && /^========= *$/ {if (found) n++; inleak = 0}
                 END {print n + 0}' "$out")
if [ -n "$errors" ] && [ "$errors" -gt 0 ] && [ "$errors" -eq "$by_design" ]; then
  echo "gpu-memcheck: all $errors errors are leaks of the CUDA context's handles and persistent buffers (kept for the life of the process by design)"
  exit 0
fi
echo "gpu-memcheck: $errors errors, $by_design of them the context's by-design leaks"
exit $rc
