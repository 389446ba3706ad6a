package fsops

import "time"

// Stats are a mount's counters since it started, for its metrics.
type Stats struct {
	// Lookups and getattrs answered from the capability cache, and
	// those the cluster answered.
	MetaHits, MetaMisses uint64
	// Reads answered from readahead windows or the data cache (fetched
	// earlier or being fetched), and read RPCs sent to the cluster
	// (direct reads and window fetches).
	WindowReads, ClusterReads uint64
	// Inodes whose capabilities the cluster recalled.
	Recalls uint64
	// Bytes write-behind acknowledged and has not committed yet.
	UnsentBytes int64
	// With buffered metadata: operations answered and not yet committed,
	// batches sent, operations committed and lost, and the time spent
	// sending the batches.
	JournalDepth                                    int64
	JournalBatches, JournalCommitted, JournalFailed int64
	JournalFlushTime                                time.Duration
}

// Stats reads the counters.
func (o *ClientOps) Stats() Stats {
	s := Stats{
		MetaHits: o.stats.metaHits.Load(), MetaMisses: o.stats.metaMisses.Load(),
		WindowReads: o.stats.windowReads.Load(), ClusterReads: uint64(o.reads.Load()),
		Recalls: o.stats.recalls.Load(), UnsentBytes: o.unsent.Load(),
	}
	if o.jr != nil {
		s.JournalDepth = o.jr.Depth()
		s.JournalBatches, s.JournalCommitted, s.JournalFailed = o.jr.Stats()
		s.JournalFlushTime = o.jr.FlushTime()
	}
	return s
}
