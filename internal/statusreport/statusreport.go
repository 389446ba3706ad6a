// Package statusreport is the JSON shape of a cluster status, shared by
// `memfs status --json` and the nodes' status page so that both always
// show the same fields under the same names.
//
// It only converts: it must never ask a node anything itself.
package statusreport

import (
	pb "github.com/memoryfs/memfs/memfspb"
)

// Report is one cluster status as `memfs status --json` prints it and the
// status page receives it. Scripts rely on these names: add fields, never
// rename them.
type Report struct {
	Leader        string  `json:"leader"`
	LeaderAPIAddr string  `json:"leader_api_addr"`
	Nodes         []Node  `json:"nodes"`
	Inodes        uint64  `json:"inodes"`
	LogicalBytes  uint64  `json:"logical_bytes"`
	PhysicalBytes uint64  `json:"physical_bytes"`
	BlockCount    uint64  `json:"block_count"`
	MemoryLimit   uint64  `json:"memory_limit"`
	Sessions      uint64  `json:"sessions"`
	ChunkSize     uint32  `json:"chunk_size"`
	SharedBytes   uint64  `json:"shared_bytes"`
	RefBytes      uint64  `json:"ref_bytes"`
	DedupRatio    float64 `json:"dedup_ratio"` // logical / physical; 1 when nothing is stored
}

// Node is one member as the answering node saw it.
type Node struct {
	ID           string `json:"id"`
	APIAddr      string `json:"api_addr"`
	RaftAddr     string `json:"raft_addr"`
	State        string `json:"state"`
	AppliedIndex uint64 `json:"applied_index"`
	CommitIndex  uint64 `json:"commit_index"`
	LastLogIndex uint64 `json:"last_log_index"`
	Voter        bool   `json:"voter"`
	Term         uint64 `json:"term"`
	// CatchingUp: back empty after losing its state and not yet holding
	// what the members had committed then; it does not campaign, and votes
	// only for a candidate that holds all of that.
	CatchingUp bool   `json:"catching_up"`
	Error      string `json:"error,omitempty"`
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
	// The process's memory (docs/operations.md, "Memory and GC").
	RSSBytes           uint64 `json:"rss_bytes"`
	AnonBytes          uint64 `json:"anon_bytes"`
	BlockMemoryBytes   uint64 `json:"block_memory_bytes"`
	ProcessMemoryLimit uint64 `json:"process_memory_limit"`
	BlockBudget        uint64 `json:"block_budget"`
}

// New converts a Status answer.
func New(st *pb.StatusResponse) Report {
	r := Report{
		Leader: st.Leader, LeaderAPIAddr: st.LeaderApiAddr, Nodes: []Node{},
		Inodes: st.Inodes, LogicalBytes: st.LogicalBytes, PhysicalBytes: st.PhysicalBytes,
		BlockCount: st.BlockCount, MemoryLimit: st.MemoryLimit, Sessions: st.Sessions, ChunkSize: st.ChunkSize,
		SharedBytes: st.SharedBytes, RefBytes: st.RefBytes, DedupRatio: 1,
	}
	if st.PhysicalBytes > 0 {
		r.DedupRatio = float64(st.LogicalBytes) / float64(st.PhysicalBytes)
	}
	for _, n := range st.Nodes {
		r.Nodes = append(r.Nodes, Node{
			ID: n.Id, APIAddr: n.ApiAddr, RaftAddr: n.RaftAddr, State: n.State,
			AppliedIndex: n.AppliedIndex, CommitIndex: n.CommitIndex, LastLogIndex: n.LastLogIndex,
			Voter: n.Voter, Term: n.Term, CatchingUp: n.CatchingUp, Error: n.Error,
			LogicalBytes: n.LogicalBytes, PhysicalBytes: n.PhysicalBytes, SharedBytes: n.SharedBytes,
			LogBytes: n.LogBytes, NetSentBytes: n.NetSentBytes, NetReceivedBytes: n.NetReceivedBytes,
			WireDedupBytes: n.WireDedupBytes,
			Restoring:      n.Restoring, SyncBlocksWanted: n.SyncBlocksWanted, SyncBlocksFetched: n.SyncBlocksFetched,
			SyncBytesWanted: n.SyncBytesWanted, SyncBytesFetched: n.SyncBytesFetched,
			SyncBytesServed: n.SyncBytesServed, SyncBytesFetchedTotal: n.SyncBytesFetchedTotal,
			SyncBlocksFetchedTotal: n.SyncBlocksFetchedTotal,
			SyncCorruptBlocks:      n.SyncCorruptBlocks,
			DiskBlocks:             n.DiskBlocks, DiskBytes: n.DiskBytes, DiskBytesWritten: n.DiskBytesWritten,
			RSSBytes: n.RssBytes, AnonBytes: n.AnonBytes, BlockMemoryBytes: n.BlockMemoryBytes,
			ProcessMemoryLimit: n.ProcessMemoryLimit, BlockBudget: n.BlockBudget,
		})
	}
	return r
}
