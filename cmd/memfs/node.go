package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client/replace"
	pb "github.com/memoryfs/memfs/memfspb"
)

func newNodeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Manage cluster membership",
	}
	cmd.AddCommand(newNodeReplaceCmd(), newNodeRemoveCmd())
	return cmd
}

func newNodeRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a node from the cluster (stop its process afterwards)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := commandContext()
			defer cancel()
			err := callCluster(ctx, func(ctx context.Context, c pb.MemFSClient) error {
				_, err := c.RemoveNode(ctx, &pb.RemoveNodeRequest{Version: pb.Version, Id: args[0]})
				return err
			})
			if err != nil {
				return fmt.Errorf("remove node %s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed node %s\n", args[0])
			return nil
		},
	}
}

type replaceOptions struct {
	with           string
	maxLag         uint64
	stable         time.Duration
	catchUpTimeout time.Duration
}

func newNodeReplaceCmd() *cobra.Command {
	o := &replaceOptions{}
	cmd := &cobra.Command{
		Use:   "replace OLD --with ID@RAFT_ADDR,API_ADDR",
		Short: "Replace node OLD by a new node, keeping a quorum throughout",
		Long: `Replace node OLD by a new node that is already running without state
(memfs server --id ID --data DIR --raft-addr RAFT_ADDR --api-addr API_ADDR,
with neither --bootstrap nor --join: it waits to be added).

The new node is added as a non-voter and catches up while clients go on
writing (on a terminal, progress bars on stderr show the bytes block sync
fetches and the log position, with rates and time left); once it trails the leader's commit index by at
most --max-lag entries for --stable, it is promoted to voter, and then OLD
is removed (a leader hands leadership over first). Stop OLD's process
afterwards. Each membership step waits at most --timeout; the catch-up at
most --catch-up-timeout. On failure the message says what the membership
is now; running the same command again resumes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.with == "" {
				return usageError{errors.New("--with ID@RAFT_ADDR,API_ADDR is required")}
			}
			target, err := replace.ParseTarget(o.with)
			if err != nil {
				return usageError{fmt.Errorf("--with %w", err)}
			}
			if target.ID == args[0] {
				return usageError{fmt.Errorf("the new node needs an id other than %s (ids are never reused)", args[0])}
			}
			addrs, err := needCluster()
			if err != nil {
				return err
			}
			sec, err := clientSecurity()
			if err != nil {
				return err
			}
			// Only Ctrl-C bounds the whole command: the catch-up may take long.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sum, err := runReplace(ctx, replace.Options{
				Old: args[0], New: target, Cluster: addrs, Security: sec,
				MaxLag: o.maxLag, Stable: o.stable,
				CatchUpTimeout: o.catchUpTimeout, StepTimeout: global.timeout,
			}, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			printSummary(cmd.OutOrStdout(), sum)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.with, "with", "", "the new node: ID@RAFT_ADDR,API_ADDR")
	f.Uint64Var(&o.maxLag, "max-lag", 64, "promote once the new node trails the leader's commit index by at most this many entries")
	f.DurationVar(&o.stable, "stable", 2*time.Second, "how long the lag must stay within --max-lag before promotion")
	f.DurationVar(&o.catchUpTimeout, "catch-up-timeout", 10*time.Minute, "give up if the new node has not caught up after this long")
	return cmd
}
