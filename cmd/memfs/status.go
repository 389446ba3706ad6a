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
	pb "github.com/memoryfs/memfs/proto"
)

var statusJSON bool

var statusCmd = &cobra.Command{
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
		st, err := replace.ClusterStatus(ctx, an, addrs, timeoutFlag)
		if err != nil {
			return err
		}
		report := newStatusReport(st)
		if statusJSON {
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(report)
		}
		return report.print(cmd.OutOrStdout())
	},
}

func init() {
	statusCmd.Flags().BoolVar(&statusJSON, "json", false, "print one JSON object (fields are stable for scripts)")
	rootCmd.AddCommand(statusCmd)
}

// statusReport is the JSON shape of `memfs status --json`. Scripts rely on
// these names: add fields, never rename them.
type statusReport struct {
	Leader        string       `json:"leader"`
	LeaderAPIAddr string       `json:"leader_api_addr"`
	Nodes         []nodeReport `json:"nodes"`
	Inodes        uint64       `json:"inodes"`
	LogicalBytes  uint64       `json:"logical_bytes"`
	PhysicalBytes uint64       `json:"physical_bytes"`
	BlockCount    uint64       `json:"block_count"`
	MemoryLimit   uint64       `json:"memory_limit"`
	Sessions      uint64       `json:"sessions"`
	ChunkSize     uint32       `json:"chunk_size"`
	SharedBytes   uint64       `json:"shared_bytes"`
	RefBytes      uint64       `json:"ref_bytes"`
	DedupRatio    float64      `json:"dedup_ratio"` // logical / physical; 1 when nothing is stored
}

type nodeReport struct {
	ID           string `json:"id"`
	APIAddr      string `json:"api_addr"`
	RaftAddr     string `json:"raft_addr"`
	State        string `json:"state"`
	AppliedIndex uint64 `json:"applied_index"`
	CommitIndex  uint64 `json:"commit_index"`
	LastLogIndex uint64 `json:"last_log_index"`
	Voter        bool   `json:"voter"`
	Error        string `json:"error,omitempty"`
	// The node's own totals and counters since it started.
	LogicalBytes     uint64 `json:"logical_bytes"`
	PhysicalBytes    uint64 `json:"physical_bytes"`
	SharedBytes      uint64 `json:"shared_bytes"`
	LogBytes         uint64 `json:"log_bytes"`
	NetSentBytes     uint64 `json:"net_sent_bytes"`
	NetReceivedBytes uint64 `json:"net_received_bytes"`
	WireDedupBytes   uint64 `json:"wire_dedup_bytes"`
	// Block sync and the block directory (docs/snapshots.md).
	Restoring              bool   `json:"restoring"`
	SyncBlocksWanted       uint64 `json:"sync_blocks_wanted"`
	SyncBlocksFetched      uint64 `json:"sync_blocks_fetched"`
	SyncBytesWanted        uint64 `json:"sync_bytes_wanted"`
	SyncBytesFetched       uint64 `json:"sync_bytes_fetched"`
	SyncBytesServed        uint64 `json:"sync_bytes_served"`
	SyncBytesFetchedTotal  uint64 `json:"sync_bytes_fetched_total"`
	SyncBlocksFetchedTotal uint64 `json:"sync_blocks_fetched_total"`
	SyncCorruptBlocks      uint64 `json:"sync_corrupt_blocks"`
	DiskBlocks             uint64 `json:"disk_blocks"`
	DiskBytes              uint64 `json:"disk_bytes"`
	DiskBytesWritten       uint64 `json:"disk_bytes_written"`
}

func newStatusReport(st *pb.StatusResponse) statusReport {
	r := statusReport{
		Leader: st.Leader, LeaderAPIAddr: st.LeaderApiAddr, Nodes: []nodeReport{},
		Inodes: st.Inodes, LogicalBytes: st.LogicalBytes, PhysicalBytes: st.PhysicalBytes,
		BlockCount: st.BlockCount, MemoryLimit: st.MemoryLimit, Sessions: st.Sessions, ChunkSize: st.ChunkSize,
		SharedBytes: st.SharedBytes, RefBytes: st.RefBytes, DedupRatio: 1,
	}
	if st.PhysicalBytes > 0 {
		r.DedupRatio = float64(st.LogicalBytes) / float64(st.PhysicalBytes)
	}
	for _, n := range st.Nodes {
		r.Nodes = append(r.Nodes, nodeReport{
			ID: n.Id, APIAddr: n.ApiAddr, RaftAddr: n.RaftAddr, State: n.State,
			AppliedIndex: n.AppliedIndex, CommitIndex: n.CommitIndex, LastLogIndex: n.LastLogIndex,
			Voter: n.Voter, Error: n.Error,
			LogicalBytes: n.LogicalBytes, PhysicalBytes: n.PhysicalBytes, SharedBytes: n.SharedBytes,
			LogBytes: n.LogBytes, NetSentBytes: n.NetSentBytes, NetReceivedBytes: n.NetReceivedBytes,
			WireDedupBytes: n.WireDedupBytes,
			Restoring:      n.Restoring, SyncBlocksWanted: n.SyncBlocksWanted, SyncBlocksFetched: n.SyncBlocksFetched,
			SyncBytesWanted: n.SyncBytesWanted, SyncBytesFetched: n.SyncBytesFetched,
			SyncBytesServed: n.SyncBytesServed, SyncBytesFetchedTotal: n.SyncBytesFetchedTotal,
			SyncBlocksFetchedTotal: n.SyncBlocksFetchedTotal,
			SyncCorruptBlocks:      n.SyncCorruptBlocks,
			DiskBlocks:             n.DiskBlocks, DiskBytes: n.DiskBytes, DiskBytesWritten: n.DiskBytesWritten,
		})
	}
	return r
}

func (r statusReport) print(w io.Writer) error {
	leader := r.Leader
	if leader == "" {
		leader = "(none: election in progress?)"
	}
	fmt.Fprintf(w, "leader: %s %s\n\n", leader, r.LeaderAPIAddr)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tAPI\tRAFT\tAPPLIED\tVOTER\tPHYSICAL\tON DISK\tLOGGED\tSENT\tERROR")
	for _, n := range r.Nodes {
		state := n.State
		if state == "" {
			state = "?"
		}
		if n.Restoring {
			state += fmt.Sprintf(" (restoring %d/%d blocks)", n.SyncBlocksFetched, n.SyncBlocksWanted)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%v\t%s\t%s\t%s\t%s\t%s\n", n.ID, state, n.APIAddr, n.RaftAddr,
			n.AppliedIndex, n.Voter, nodeBytes(n, n.PhysicalBytes), nodeBytes(n, n.DiskBytes), nodeBytes(n, n.LogBytes),
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
	fmt.Fprintln(w, "(PHYSICAL: unique block bytes in the node's memory; ON DISK: its block directory; LOGGED and SENT: Raft log and network bytes since it started)")
	return nil
}

// nodeBytes prints a per-node byte count, or "-" for a node that did not
// answer.
func nodeBytes(n nodeReport, v uint64) string {
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
