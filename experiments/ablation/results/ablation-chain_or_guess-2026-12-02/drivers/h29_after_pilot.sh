#!/bin/bash
# Waits for the pilot driver (PGID 7047: vb_cog) to end, then runs the table driver.
while kill -0 7047 2>/dev/null; do sleep 20; done
echo "[waiter] $(date -u +%FT%TZ) pilot driver ended; starting the table driver"
exec /work/runs/h29_table.sh
