// Package archive holds the events a worklog store pruned (work.Options.ArchiveDir): the
// store writes every event it is about to prune into an archive segment and fsyncs it
// before the batch that removes the events commits, so that history pruned from the live
// store can still be read (replay --archive) and audited.
//
// # Format (version 1)
//
// An archive is a directory of segments, seg-000001.wla, seg-000002.wla, ... A Writer
// never appends to a segment an earlier Writer wrote: each Open starts the next one, and
// rolls to a new one after SegmentBytes. A segment is
//
//	header (32 bytes):
//	  0  magic "WLARCHV\x00"
//	  8  version u16 (1)
//	  10 zero u16
//	  12 segment number u32
//	  16 valid length of the previous segment u64 (0 for the first one written)
//	  24 zero u32
//	  28 CRC-32C (Castagnoli) of bytes 0..28
//	frames, each:
//	  0  magic "WLF1"
//	  4  codec u8 (0 none, 1 zstd), three zero bytes
//	  8  records u32
//	  12 runs index length u32
//	  16 payload length as stored u32
//	  20 payload length raw u32
//	  24 first seq u64
//	  32 last seq u64
//	  40 CRC-32C of the runs index u32
//	  44 CRC-32C of the stored payload u32
//	  48 CRC-32C of bytes 0..48 u32
//	  52 runs index: the frame's sequences as runs, uvarint (from - previous to, to - from)
//	     payload: the records in ascending seq, compressed as a whole with codec:
//	       seq u64, length u32, the event's wire bytes (events' format, with its own
//	       CRC-32C), CRC-32C of the 12 + length bytes before it u32
//
// All integers are big-endian. A Writer's Commit writes the frames and fsyncs the segment
// (and the directory when it created the segment) before it returns.
//
// # What a reader accepts
//
// Every header, runs index and payload is checked against its checksum, every record
// against its own and the frame's runs; a failure is an *Error naming the file and offset,
// matching ErrCorrupt. The only damage dropped silently is a torn tail: the bytes after a
// segment's last valid frame when they were never fsynced. A Writer that opens the archive
// after a crash records the last segment's valid length in the next segment's header, so
// that in any segment but the last the tail is known exactly and damage before it is
// refused; in the last segment everything from the first frame a torn write can explain on
// is a torn tail (bytes missing, a checksum that fails). A frame header whose checksum holds
// was written whole: a claim in it no Writer makes is damage in any segment, named as such.
// No frame is larger than 72 MiB, raw or stored (the largest event, one 64 MiB value with
// its texts, fits): a header claiming more is refused before anything is allocated for it,
// and decompression stops at the raw length the header declares.
// Damage in the last segment's tail cannot be told from an unsynced write; the store's
// pruned ranges can: Reader.Missing lists the pruned sequences the archive lacks (replay
// verify --archive).
//
// A sequence may be archived more than once (a crash between the segment's fsync and the
// prune's commit leaves the events live, and the next prune archives them again). Readers
// return each sequence once; its copies must be byte-identical, or the archive is corrupt.
package archive
