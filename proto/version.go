package memfspb

// Version is the protocol version this code speaks, carried in every
// request. A node answers a request of another version with
// FAILED_PRECONDITION.
const Version = 1

// MaxMessageData is the most file data one message carries; larger reads
// and writes are streamed in frames of this size.
const MaxMessageData = 1 << 20

// LeaderTrailer is the gRPC trailer key in which a follower names the
// leader's API address when it cannot serve a request itself.
const LeaderTrailer = "memfs-leader"

// MaxSyncHashes is the most block hashes one MissingBlocks or FetchBlocks
// request may name.
const MaxSyncHashes = 4096
