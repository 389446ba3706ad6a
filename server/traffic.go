package server

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// traffic counts what replication costs this node: payload bytes appended
// to its Raft log, bytes its Raft transport moved, and write bytes it sent
// by hash instead of data as leader. Counters start at zero with the
// process.
type traffic struct {
	logBytes      atomic.Uint64
	netSent       atomic.Uint64
	netReceived   atomic.Uint64
	dedupBytes    atomic.Uint64 // write data replaced by hashes in log entries
	dedupResends  atomic.Uint64 // by-hash entries refused (EREMOTEIO) and resent with data
	dedupCommands atomic.Uint64 // write commands sent with at least one chunk by hash
}

// Traffic is a moment's view of a node's replication counters.
type Traffic struct {
	// LogBytes is the sum of the payloads of the entries appended to this
	// node's Raft log (the leader's own and those it received).
	LogBytes uint64
	// NetSent and NetReceived count bytes on the Raft transport's
	// connections (AppendEntries, votes, heartbeats, snapshot installs);
	// zero when the transport was injected.
	NetSent, NetReceived uint64
	// DedupBytes is how many bytes of writes this node, as leader, put
	// into log entries as block hashes instead of data.
	DedupBytes uint64
	// DedupCommands counts writes that went with at least one block by
	// hash; DedupResends those refused with EREMOTEIO and resent whole.
	DedupCommands, DedupResends uint64
}

// Traffic returns the node's replication counters.
func (n *Node) Traffic() Traffic {
	t := &n.traffic
	return Traffic{
		LogBytes: t.logBytes.Load(), NetSent: t.netSent.Load(), NetReceived: t.netReceived.Load(),
		DedupBytes: t.dedupBytes.Load(), DedupCommands: t.dedupCommands.Load(), DedupResends: t.dedupResends.Load(),
	}
}

// countingLogStore adds the payload size of every stored entry to a
// counter. It keeps the wrapped store's MonotonicLogStore promise, which
// changes how Raft treats the log after a snapshot restore.
type countingLogStore struct {
	raft.LogStore
	n     *atomic.Uint64
	watch *storeWatch // told of every write, so the batcher sees its entries stored
	held  *heldLog    // the sizes of the entries held, to bound the log in bytes
}

var _ raft.MonotonicLogStore = countingLogStore{}

func (s countingLogStore) StoreLog(l *raft.Log) error {
	return s.StoreLogs([]*raft.Log{l})
}

func (s countingLogStore) StoreLogs(logs []*raft.Log) error {
	if err := s.LogStore.StoreLogs(logs); err != nil {
		return err
	}
	if s.watch != nil {
		s.watch.stored(logs)
	}
	if s.held != nil {
		s.held.stored(logs)
	}
	var sum uint64
	for _, l := range logs {
		sum += uint64(len(l.Data) + len(l.Extensions))
	}
	s.n.Add(sum)
	return nil
}

func (s countingLogStore) DeleteRange(minIdx, maxIdx uint64) error {
	if err := s.LogStore.DeleteRange(minIdx, maxIdx); err != nil {
		return err
	}
	if s.held != nil {
		s.held.deleted(minIdx, maxIdx)
	}
	return nil
}

func (s countingLogStore) IsMonotonic() bool {
	m, ok := s.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// countingStream is a raft.StreamLayer over TCP whose connections count
// the bytes they carry, in both directions, so a node can report what
// replication sent over the network.
type countingStream struct {
	lis       net.Listener
	advertise net.Addr
	t         *traffic
}

// newCountingTCPStream listens on bind. Like raft's own TCP layer it
// refuses an address other nodes could not dial (0.0.0.0 without an
// advertised address).
func newCountingTCPStream(bind string, advertise net.Addr, t *traffic) (*countingStream, error) {
	lis, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	s := &countingStream{lis: lis, advertise: advertise, t: t}
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok || addr.IP == nil || addr.IP.IsUnspecified() {
		_ = lis.Close()
		return nil, fmt.Errorf("raft address %v cannot be dialled by other nodes (set an advertise address)", s.Addr())
	}
	return s, nil
}

func (s *countingStream) Accept() (net.Conn, error) {
	c, err := s.lis.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, t: s.t}, nil
}

func (s *countingStream) Close() error { return s.lis.Close() }

func (s *countingStream) Addr() net.Addr {
	if s.advertise != nil {
		return s.advertise
	}
	return s.lis.Addr()
}

func (s *countingStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, t: s.t}, nil
}

// countingConn counts bytes read and written. Raft buffers both sides of
// its connections, so the atomic adds happen per buffer, not per message
// field.
type countingConn struct {
	net.Conn
	t *traffic
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.t.netReceived.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.t.netSent.Add(uint64(n))
	return n, err
}
