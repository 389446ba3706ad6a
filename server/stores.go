package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	raftwal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"go.etcd.io/bbolt"

	"github.com/memoryfs/memfs/internal/pageout"
)

// openedStores are the stores of one node and what to close when it stops.
type openedStores struct {
	Stores
	closers []io.Closer
}

func (s *openedStores) close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i].Close())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// openStores opens the stores cfg asks for; pre-built ones in cfg.Stores
// win field by field.
func openStores(cfg *Config, logger hclog.Logger) (*openedStores, error) {
	s := &openedStores{}
	if cfg.Stores != nil {
		s.Stores = *cfg.Stores
	}
	if s.Log == nil || s.Stable == nil {
		kind := cfg.LogStore
		if cfg.Ephemeral {
			kind = LogStoreMem
		}
		if err := s.openLog(kind, cfg.DataDir, cfg.Raft, logger); err != nil {
			_ = s.close()
			return nil, err
		}
	}
	if s.Snapshots == nil {
		if cfg.Ephemeral {
			s.Snapshots = newMemSnapshots()
		} else {
			snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, cfg.Raft.SnapshotRetain, logger.Named("snapshot"))
			if err != nil {
				_ = s.close()
				return nil, fmt.Errorf("open snapshot store in %s: %w", cfg.DataDir, err)
			}
			s.Snapshots = snaps
		}
	}
	return s, nil
}

// openLog opens the log and stable store of the given kind. Only the
// fields still nil are set, so a caller may supply one of the two.
func (s *openedStores) openLog(kind, dir string, tune RaftTuning, logger hclog.Logger) error {
	var logs raft.LogStore
	var stable raft.StableStore
	var onPause func()
	switch kind {
	case LogStoreMem:
		m := raft.NewInmemStore()
		logs, stable = m, m
	case LogStoreWAL:
		walDir := filepath.Join(dir, "wal")
		if err := os.MkdirAll(walDir, 0o700); err != nil {
			return fmt.Errorf("create wal dir: %w", err)
		}
		// WAL.Close leaves its metadata store open (raft-wal v0.4.0), so
		// the node owns it and closes it after the WAL.
		meta := &metadb.BoltMetaDB{}
		s.closers = append(s.closers, meta)
		w, err := raftwal.Open(walDir, raftwal.WithLogger(logger.Named("wal")), raftwal.WithMetaStore(meta))
		if err != nil {
			return fmt.Errorf("open raft-wal in %s: %w", walDir, err)
		}
		s.closers = append(s.closers, w)
		logs, stable = w, w
	default:
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create data dir: %w", err)
		}
		path := filepath.Join(dir, "raft.db")
		// A timeout on the file lock: a second process on the same data
		// dir fails instead of hanging.
		b, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{Timeout: 2 * time.Second}})
		if err != nil {
			return fmt.Errorf("open raft-boltdb %s (is another node using this data dir?): %w", path, err)
		}
		s.closers = append(s.closers, b)
		logs, stable = b, b
		onPause = pageOutOnPause(path, logger)
	}
	if kind != LogStoreMem {
		c := newLogCache(logs, tune.LogCacheSize, tune.LogCacheBytes, tune.LogCacheIdleBytes, onPause)
		stop := c.watch(logCacheIdleAfter)
		s.closers = append(s.closers, closerFunc(func() error { stop(); return nil }))
		logs = c
	}
	if s.Log == nil {
		s.Log = logs
	}
	if s.Stable == nil {
		s.Stable = stable
	}
	return nil
}

// HasState reports whether dir holds a node's Raft state (a log, a term
// or a snapshot), so a launcher can tell a new cluster from an old one. It
// opens the stores, so the node must not be running.
func HasState(dir string) (bool, error) {
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 1, hclog.NewNullLogger())
	if err != nil {
		return false, err
	}
	list, err := snaps.List()
	if err != nil || len(list) > 0 {
		return len(list) > 0, err
	}
	for _, kind := range []string{LogStoreBolt, LogStoreWAL} {
		name := "raft.db"
		if kind == LogStoreWAL {
			name = "wal"
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			continue
		}
		s := &openedStores{}
		if err := s.openLog(kind, dir, RaftTuning{LogCacheSize: 1, LogCacheBytes: 1}, hclog.NewNullLogger()); err != nil {
			return false, err
		}
		has, err := raft.HasExistingState(s.Log, s.Stable, snaps)
		if cerr := s.close(); err == nil {
			err = cerr
		}
		if err != nil || has {
			return has, err
		}
	}
	return false, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// pageOutOnPause is the log cache's hook for raft-boltdb. bbolt reads the
// log through a shared mapping of its file, and every page a read or a
// compaction touched stays in the node's RSS: hundreds of MiB after a few
// GiB written (docs/benchmarks.md, "Memory per stored byte"), though the
// page cache holds them anyway. When writes pause they go back to the
// kernel; a later read finds them in the page cache.
func pageOutOnPause(path string, logger hclog.Logger) func() {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real // /proc/self/maps names the file so
	}
	return func() {
		n, err := pageout.File(path)
		if err != nil {
			logger.Debug("page out the raft log file", "path", path, "error", err)
			return
		}
		logger.Debug("paged out the raft log file", "path", path, "mapped_bytes", n)
	}
}
