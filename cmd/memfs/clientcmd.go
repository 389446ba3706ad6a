package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
)

// newClient connects to the --cluster addresses under cmd's context. The
// client retries for at most --timeout and logs session trouble to stderr.
func newClient(cmd *cobra.Command, opts ...client.Option) (*client.Client, error) {
	addrs, err := needCluster()
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sec, err := clientSecurity()
	if err != nil {
		return nil, err
	}
	opts = append(append(sec,
		client.WithRetryTimeout(global.timeout),
		client.WithLogger(log),
		client.WithName("memfs "+cmd.Name()),
	), opts...)
	c, err := client.New(cmd.Context(), addrs, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to cluster: %w", err)
	}
	return c, nil
}

// clientRun adapts a file command: it sets up the command's context (Ctrl-C
// ends it; --timeout bounds each operation, not the command), connects,
// runs f with a client bound to that context, and closes the client.
func clientRun(f func(ctx context.Context, cmd *cobra.Command, c *client.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ctx, cancel := interruptContext()
		defer cancel()
		cmd.SetContext(ctx)
		c, err := newClient(cmd)
		if err != nil {
			return err
		}
		defer c.Close()
		return f(ctx, cmd, c.WithContext(ctx), args)
	}
}
