// Package region keeps a cluster file in a program's memory as a managed
// region (docs/regions.md): a local copy of the file's chunks (one chunk
// per cluster block) filled on demand and in the background, written
// locally under the session's exclusive capability and written back in
// the background, and moved to another host with a pause of milliseconds
// (Leech on the new host, Finalize on the old).
//
// It speaks only through package client: RegionQuery for chunk hashes
// and data (which never recalls anyone's capability), fenced BatchCmds
// for write-back, LeechCmd and HandoffCmd for the move. It must never
// import the server or the state machine, and never write a chunk
// without a fence on the capability it was written under.
//
// # Bytes and writes through the view
//
// Bytes returns the region's memory itself (anonymous memory, not on the
// Go heap). Until Fetch or Wait says a range is local, its bytes may be
// zeros and the puller may be filling them: a program reads through the
// view only ranges made local, and never while a Sync or Finalize runs.
// Writes through the view are found at Sync (and Finalize) by comparing
// every local chunk's hash with the hash it had when last fetched or
// pushed, which costs a hash of the whole region (about 0.5 s per GiB
// here); MarkDirty(off, n) names them cheaply instead, and once a program
// has called MarkDirty the scan is skipped. WriteAt needs neither.
package region
