package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/server/opsweb"
)

func newHealthCmd() *cobra.Command {
	var live bool
	cmd := &cobra.Command{
		Use:   "health [--live] METRICS_ADDR",
		Short: "Ask a node whether it is ready (or, with --live, alive); exit 1 if not",
		Long: `Ask the node serving --metrics-addr METRICS_ADDR for /readyz: ready means
it is a member of a cluster with a leader, has applied what it knows to be
committed (within a few hundred entries), and is not restoring a snapshot.
With --live it asks /livez, which any running node answers. Meant for
health checks where no HTTP client is at hand (the server image has no
shell); exit status 0 when the answer is yes, 1 with the node's reason when
not.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/readyz"
			if live {
				path = "/livez"
			}
			ctx, cancel := commandContext()
			defer cancel()
			if err := opsweb.Probe(ctx, args[0], path); err != nil {
				return explainedError{err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s%s: ok\n", args[0], path)
			return nil
		},
	}
	cmd.Flags().BoolVar(&live, "live", false, "ask /livez (the process answers) instead of /readyz")
	return cmd
}

// waitReadyz polls addr's /readyz until it says ready or ctx ends; the
// error then is the node's last reason.
func waitReadyz(ctx context.Context, addr string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := opsweb.Probe(pctx, addr, "/readyz")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)
		}
	}
}
