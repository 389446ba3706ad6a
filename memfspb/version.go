package memfspb

// Version is the protocol version this code speaks, carried in every
// request. A node answers a request of another version with
// FAILED_PRECONDITION.
const Version = 1

// MaxMessageData is the most file data one message carries; larger reads
// and writes are streamed in frames of this size.
const MaxMessageData = 1 << 20

// LeaderTrailer is the gRPC trailer key in which a follower names the
// leader's API address when it cannot serve a request itself, and in the
// answer to a request it forwarded to the leader.
const LeaderTrailer = "memfs-leader"

// MaxSyncHashes is the most block hashes one MissingBlocks or FetchBlocks
// request may name.
const MaxSyncHashes = 4096

// MaxFileSize is the largest size of a file: a write or truncate past it
// is EFBIG. The kernel assumes 2^63-1 for every FUSE mount, so the mount
// checks it itself before it answers a write it has not sent yet.
const MaxFileSize = 1 << 40
