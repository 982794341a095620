#!/bin/bash
# Run here (not on the GPU machine) before scripts/gpu/run.sh: the GPU machine's image has no
# CBC (which torch_plugin._C links) and nothing can be installed there, so its headers and
# libraries travel in .gpu/ (ignored by git; ~21 MB) with a pkg-config stand-in for them.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu && mkdir -p .gpu/cbc/lib .gpu/cbc/include .gpu/bin
cp -r "$(pkg-config --variable=includedir cbc)" .gpu/cbc/include/coin
for l in CbcSolver Cbc Cgl OsiClp ClpSolver Clp Osi CoinUtils bz2 z lapack blas gfortran quadmath; do
  f=$(ls /usr/lib/x86_64-linux-gnu/lib$l.so 2>/dev/null || ls /lib/x86_64-linux-gnu/lib$l.so.* | head -1)
  real=$(readlink -f "$f")
  soname=$(objdump -p "$real" | awk '/SONAME/{print $2}')
  cp -L "$real" ".gpu/cbc/lib/$soname"
  ln -sf "$soname" ".gpu/cbc/lib/lib$l.so"
done
cat > .gpu/bin/pkg-config <<'PC'
#!/bin/sh
# Answers setup.py's two questions about cbc from the copy beside it.
d=$(cd "$(dirname "$0")/../cbc" && pwd)
case "$*" in
  *--cflags*) echo "-I$d/include/coin" ;;
  *--libs*) echo "-L$d/lib -Wl,-rpath,$d/lib -lCbcSolver -lCbc -lpthread -lrt -lCgl -lOsiClp -lClpSolver -lClp -lOsi -lCoinUtils -lbz2 -lz -llapack -lblas -lm" ;;
  *) exit 1 ;;
esac
PC
chmod +x .gpu/bin/pkg-config
du -sh .gpu
