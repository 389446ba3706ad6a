package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
)

func newCheckCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Check the cluster (perf)",
	}
	cmd.AddCommand(newCheckPerfCmd())
	return cmd
}

// checkLoads are the loads of memfs check perf: bytes written in 1 MiB
// commands with 16 in flight, then files created by 16 clients.
var checkLoads = map[string]struct {
	total   int64
	creates int
}{
	"s": {64 << 20, 1000},
	"m": {256 << 20, 4000},
	"l": {1 << 30, 10000},
}

type checkPerfOptions struct {
	load          string
	minWriteMBps  float64
	maxWriteP99   time.Duration
	minCreatesSec float64
	maxCreateP99  time.Duration
}

func newCheckPerfCmd() *cobra.Command {
	o := &checkPerfOptions{}
	cmd := &cobra.Command{
		Use:   "perf",
		Short: "A short load: can the cluster's disks and network hold the rates MemoryFS promises?",
		Long: `Run a short load against the cluster, as memfs bench does (1 MiB writes,
16 in flight, each committed on a majority's disk; then 4 KiB files created
by 16 clients), and say whether it held the rates the docs promise: by
default at least 20 MB/s of replicated writes (ten times the original
MemoryFS) with a p99 of at most 2 s, and at least 500 creates/s with a p99
of at most 500 ms (docs/benchmarks.md has what this project's machines
reach). --load s, m or l sets the size (64 MiB and 1000 files, 256 MiB and
4000, 1 GiB and 10000). Each check prints PASS or FAIL; exit status 1 when
any fails. Everything it writes is removed at the end.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			load, ok := checkLoads[o.load]
			if !ok {
				return usageError{fmt.Errorf("--load %q: want s, m or l", o.load)}
			}
			b := &benchOptions{total: byteSize(load.total), size: 1 << 20, concurrency: 16,
				creates: load.creates, clients: 16, fileSize: 4 << 10, phases: "write,create"}
			ctx, stop := interruptContext()
			defer stop()
			fmt.Fprintf(cmd.ErrOrStderr(), "memfs: writing %s and creating %d files...\n",
				formatBytes(load.total), load.creates)
			rep, err := b.measure(ctx, cmd)
			if err != nil {
				return err
			}
			return o.judgePerf(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.load, "load", "s", "size of the load: s, m or l")
	f.Float64Var(&o.minWriteMBps, "min-write-mbps", 20, "replicated write throughput to reach, MB/s (10^6 bytes)")
	f.DurationVar(&o.maxWriteP99, "max-write-p99", 2*time.Second, "p99 latency of a 1 MiB write not to exceed")
	f.Float64Var(&o.minCreatesSec, "min-creates", 500, "file creates per second to reach")
	f.DurationVar(&o.maxCreateP99, "max-create-p99", 500*time.Millisecond, "p99 latency of a create not to exceed")
	return cmd
}

// errPerfFailed is the exit of a check that ran and found the cluster
// too slow; its lines already say why.
var errPerfFailed = errors.New("check perf: FAIL")

// judgePerf prints one PASS or FAIL line per target and the verdict.
func (o *checkPerfOptions) judgePerf(w io.Writer, rep benchReport) error {
	failed := false
	check := func(ok bool, format string, args ...any) {
		verdict := "PASS"
		if !ok {
			verdict, failed = "FAIL", true
		}
		fmt.Fprintf(w, "%s: "+format+"\n", append([]any{verdict}, args...)...)
	}
	for _, p := range rep.Phases {
		switch p.Phase {
		case "write":
			check(p.MBPerSec >= o.minWriteMBps, "write throughput %.1f MB/s (want at least %.1f)", p.MBPerSec, o.minWriteMBps)
			check(p.P99Ms <= ms(o.maxWriteP99), "write p99 %.0f ms (want at most %.0f)", p.P99Ms, ms(o.maxWriteP99))
		case "create":
			check(p.OpsPerSec >= o.minCreatesSec, "creates %.0f/s (want at least %.0f)", p.OpsPerSec, o.minCreatesSec)
			check(p.P99Ms <= ms(o.maxCreateP99), "create p99 %.1f ms (want at most %.0f)", p.P99Ms, ms(o.maxCreateP99))
		}
	}
	if failed {
		fmt.Fprintln(w, "FAIL")
		return explainedError{errPerfFailed}
	}
	fmt.Fprintln(w, "PASS")
	return nil
}
