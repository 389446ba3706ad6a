package fsops

import (
	"sync"
	"sync/atomic"
)

// The handle table: every handle this mount has open, by inode (for the
// barriers and attribute answers that must see all of an inode's
// handles) and by handle number (for the operations that name one). A
// handle carries its write-behind state (writebehind.go) and, for a
// buffered create, its journaled content (buffered.go).

// openFile is one handle this mount opened, with its write-behind state.
type openFile struct {
	ino, handle uint64
	append      bool
	// remote is the cluster handle a local handle (capops.go) was pinned
	// with; 0 before.
	remote atomic.Uint64

	// sendMu is held from taking the buffer until its commit is counted in
	// flight, so buffers claim their ranges in the order they were filled
	// and a drain that follows sees every commit started before it.
	sendMu sync.Mutex

	mu     sync.Mutex
	buf    []byte // guarded by mu: collected data not yet sent
	bufOff int64  // guarded by mu: file offset of buf[0]

	wrote atomic.Int64 // when the latest write was acknowledged (Unix ns)

	slots   chan struct{}  // one token per commit in flight
	pending atomic.Int64   // bytes acknowledged but not yet committed
	ranges  []*flightRange // guarded by mu: the commits in flight
	// sending is the end of the buffer sendBuffered took and has not yet
	// claimed a range for (it waits for an overlapping commit or a free
	// slot meanwhile): in neither buf nor ranges, it must still count in
	// the size the mount answers (collectedEnd). 0 when none.
	sending int64 // guarded by mu

	errMu sync.Mutex
	err   error // guarded by errMu: first background commit failure

	ra raState

	// journaled: writes go to the journal (a file made by a buffered
	// create, while small); jbytes counts what they carried.
	journaled atomic.Bool
	jbytes    atomic.Int64
	jdata     []byte // guarded by mu: the new file's content, while journaled
}

func newOpenFile(ino, handle uint64, appendMode bool) *openFile {
	return &openFile{ino: ino, handle: handle, append: appendMode, slots: make(chan struct{}, writeDepth)}
}

// register records f so that barriers on its inode find it.
func (o *ClientOps) register(f *openFile) {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	if o.files[f.ino] == nil {
		o.files[f.ino] = map[uint64]*openFile{}
	}
	o.files[f.ino][f.handle] = f
	o.byHandle[f.handle] = f
	if isLocal(f.handle) {
		o.localOpens.Add(1)
	}
}

func (o *ClientOps) unregister(f *openFile) {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	if _, ok := o.byHandle[f.handle]; ok && isLocal(f.handle) {
		o.localOpens.Add(-1)
	}
	delete(o.files[f.ino], f.handle)
	delete(o.byHandle, f.handle)
	if len(o.files[f.ino]) == 0 {
		delete(o.files, f.ino)
	}
}

func (o *ClientOps) file(handle uint64) *openFile {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	return o.byHandle[handle]
}

// dirty reports whether ino has writes or attribute changes acknowledged
// but not committed.
func (o *ClientOps) dirty(ino uint64) bool {
	for _, f := range o.openFiles(ino) {
		if f.pending.Load() > 0 {
			return true
		}
	}
	return o.hasHeld(ino)
}

// dirtyInodes returns every inode dirty reports true for: only those with
// open handles or held attribute state can be.
func (o *ClientOps) dirtyInodes() map[uint64]bool {
	o.filesMu.Lock()
	inos := make([]uint64, 0, len(o.files)+len(o.attrs))
	for ino := range o.files {
		inos = append(inos, ino)
	}
	for ino := range o.attrs {
		inos = append(inos, ino)
	}
	o.filesMu.Unlock()
	out := map[uint64]bool{}
	for _, ino := range inos {
		if o.dirty(ino) {
			out[ino] = true
		}
	}
	return out
}

// openFiles returns the handles this mount has open on ino.
func (o *ClientOps) openFiles(ino uint64) []*openFile {
	o.filesMu.Lock()
	defer o.filesMu.Unlock()
	fs := make([]*openFile, 0, len(o.files[ino]))
	for _, f := range o.files[ino] {
		fs = append(fs, f)
	}
	return fs
}
