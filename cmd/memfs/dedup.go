package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/memoryfs/memfs/client"
	"github.com/memoryfs/memfs/internal/progress"
)

func newCloneCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "clone [-r] SRC DST",
		Short: "Copy a file (or with -r a directory tree) copy-on-write",
		Long: `Copy SRC to DST by sharing its blocks: the copy costs inode metadata only,
and blocks stay shared until either side writes them. One command, applied
atomically: DST appears whole or not at all.`,
		Args: cobra.ExactArgs(2),
		RunE: clientRun(func(_ context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			fi, err := c.Lstat(args[0])
			if err != nil {
				return err
			}
			if fi.IsDir() && !recursive {
				return usageError{fmt.Errorf("clone %s: is a directory (use -r)", args[0])}
			}
			// One atomic command: its progress cannot be known, only that it
			// is still running.
			stop := func() {}
			if fi.IsDir() {
				stop = progress.Waiting(cmd.ErrOrStderr(), "clone -r "+args[0], global.quiet)
			}
			err = c.Clone(args[0], args[1])
			stop()
			return err
		}),
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "clone a directory and everything under it")
	return cmd
}

// duReport is what `memfs du --json` prints.
type duReport struct {
	Path          string  `json:"path"`
	Files         uint64  `json:"files"`
	LogicalBytes  uint64  `json:"logical_bytes"`
	PhysicalBytes uint64  `json:"physical_bytes"`
	SharedBytes   uint64  `json:"shared_bytes"`
	DedupRatio    float64 `json:"dedup_ratio"`
}

func newDuCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "du [--json] [PATH]",
		Short: "Show logical, physical and shared bytes of a tree (dedup accounting)",
		Long: `Show the dedup accounting of the tree at PATH (default /): its files, their
logical size, the physical bytes of the unique blocks they use, how many of
those bytes are shared (used more than once, inside or outside the tree),
and the dedup ratio logical/physical.`,
		Args: cobra.MaximumNArgs(1),
		RunE: clientRun(func(_ context.Context, cmd *cobra.Command, c *client.Client, args []string) error {
			name := "/"
			if len(args) == 1 {
				name = args[0]
			}
			u, err := c.Usage(name)
			if err != nil {
				return err
			}
			r := duReport{Path: name, Files: u.Files, LogicalBytes: u.LogicalBytes,
				PhysicalBytes: u.PhysicalBytes, SharedBytes: u.SharedBytes, DedupRatio: 1}
			if u.PhysicalBytes > 0 {
				r.DedupRatio = float64(u.LogicalBytes) / float64(u.PhysicalBytes)
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			fmt.Fprintf(out, "%-10s %12s %12s %12s %7s  %s\n", "FILES", "LOGICAL", "PHYSICAL", "SHARED", "DEDUP", "PATH")
			fmt.Fprintf(out, "%-10d %12s %12s %12s %6.2fx  %s\n", r.Files, humanBytes(r.LogicalBytes),
				humanBytes(r.PhysicalBytes), humanBytes(r.SharedBytes), r.DedupRatio, r.Path)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
