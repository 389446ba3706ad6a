package procs

import (
	"time"

	"github.com/memoryfs/memfs/test/faultnet"
)

// faultsLossy is the unreliable-network fault set for byte streams:
// per-chunk delay with jitter and an occasional reset.
func faultsLossy() faultnet.Faults {
	return faultnet.Faults{Delay: time.Millisecond, Jitter: 15 * time.Millisecond, Reset: 0.003}
}
