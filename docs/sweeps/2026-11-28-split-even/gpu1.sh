bash .scratch/probe_ncu.sh > $OUT/probe.txt 2>&1
NCU=$(which ncu || find / -maxdepth 6 -name ncu -type f 2>/dev/null | head -1)
timeout 300 python .scratch/ln_ablate.py $OUT > $OUT/ablate.log 2>&1; echo "ablate rc=$?"
if [ -n "$NCU" ]; then
  for k in layernorm_fwd_split_kernel rmsnorm_fwd_split_kernel; do
    timeout 120 $NCU -k $k --launch-skip 2 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis python .scratch/ncu_target.py 1024 131072 > $OUT/ncu_$k.txt 2>&1; echo "ncu $k rc=$?"
  done
fi
cat $OUT/probe.txt | head -30; tail -45 $OUT/ablate.log
