package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/memoryfs/memfs/client/replace"
	"github.com/memoryfs/memfs/internal/statusreport"
	pb "github.com/memoryfs/memfs/memfspb"
)

func newStatusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's leader, nodes and usage",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := commandContext()
			defer cancel()
			addrs, err := needCluster()
			if err != nil {
				return err
			}
			// The leader's view: a follower's may show a membership change
			// that is not committed yet.
			an, err := adminNet()
			if err != nil {
				return err
			}
			st, err := replace.ClusterStatus(ctx, an, addrs, global.timeout)
			if err != nil {
				return err
			}
			report := statusreport.New(st)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(report)
			}
			return printStatus(cmd.OutOrStdout(), report)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (fields are stable for scripts)")
	return cmd
}

// printStatus prints r as the readable table of memfs status.
func printStatus(w io.Writer, r statusreport.Report) error {
	leader := r.Leader
	if leader == "" {
		leader = "(none: election in progress?)"
	}
	fmt.Fprintf(w, "leader: %s %s\n\n", leader, r.LeaderAPIAddr)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tAPI\tRAFT\tAPPLIED\tVOTER\tPHYSICAL\tRSS\tON DISK\tLOGGED\tSENT\tERROR")
	for _, n := range r.Nodes {
		state := n.State
		if state == "" {
			state = "?"
		}
		if n.CatchingUp {
			state += " (catching up: not voting)"
		}
		if n.Restoring {
			state += fmt.Sprintf(" (restoring %d/%d blocks)", n.SyncBlocksFetched, n.SyncBlocksWanted)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%v\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, state, n.APIAddr, n.RaftAddr,
			n.AppliedIndex, n.Voter, nodeBytes(n, n.PhysicalBytes), rss(n), nodeBytes(n, n.DiskBytes), nodeBytes(n, n.LogBytes),
			nodeBytes(n, n.NetSentBytes), n.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\ninodes %d; logical %s, physical %s in %d blocks, shared %s, dedup %.2fx\n",
		r.Inodes, humanBytes(r.LogicalBytes), humanBytes(r.PhysicalBytes), r.BlockCount,
		humanBytes(r.SharedBytes), r.DedupRatio)
	limit := "none"
	if r.MemoryLimit > 0 {
		limit = fmt.Sprintf("%s (%s free)", humanBytes(r.MemoryLimit), humanBytes(r.MemoryLimit-min(r.MemoryLimit, r.PhysicalBytes)))
	}
	fmt.Fprintf(w, "memory limit %s, chunk %s, %d sessions\n", limit, humanBytes(uint64(r.ChunkSize)), r.Sessions)
	fmt.Fprintln(w, "(PHYSICAL: unique block bytes in the node's memory; RSS: the node process's resident memory, its ratio to PHYSICAL, and its limit; ON DISK: its block directory; LOGGED and SENT: Raft log and network bytes since it started)")
	return nil
}

// rss prints a node's resident memory, its ratio to the node's physical
// bytes and its whole-process limit, or "-" for a node that did not say.
func rss(n statusreport.Node) string {
	if n.Error != "" || n.RSSBytes == 0 {
		return "-"
	}
	s := humanBytes(n.RSSBytes)
	if n.PhysicalBytes > 0 {
		s += fmt.Sprintf(" (%.2fx)", float64(n.RSSBytes)/float64(n.PhysicalBytes))
	}
	if n.ProcessMemoryLimit > 0 {
		s += " of " + humanBytes(n.ProcessMemoryLimit)
	}
	return s
}

// nodeBytes prints a per-node byte count, or "-" for a node that did not
// answer.
func nodeBytes(n statusreport.Node, v uint64) string {
	if n.Error != "" {
		return "-"
	}
	return humanBytes(v)
}

// humanBytes prints n with a binary unit.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// adminDial opens a raw gRPC connection to one node (the admin commands do
// not need the client library's sessions and retries).
func adminDial(addr string) (*grpc.ClientConn, error) {
	n, err := adminNet()
	if err != nil {
		return nil, err
	}
	return replace.Dial(addr, n)
}

// callCluster runs fn against the --cluster nodes in turn until one
// answers with anything but UNAVAILABLE.
func callCluster(ctx context.Context, fn func(context.Context, pb.MemFSClient) error) error {
	addrs, err := needCluster()
	if err != nil {
		return err
	}
	n, err := adminNet()
	if err != nil {
		return err
	}
	return replace.CallAddrs(ctx, n, addrs, fn)
}
