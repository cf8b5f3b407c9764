// Package bytesize writes an amount of bytes for people, one way for all of bex:
// the gitserver's system:df and its limits, the builder's and the image
// importer's disk and size messages, the local runtime's memory limits.
//
// The format is df -h's with binary units and a space: a whole number of bytes
// below 1 KiB ("512 B"), one decimal below ten of a unit ("1.0 GiB", "1.5 MiB"),
// a whole number from ten ("612 MiB", "100 MiB"), rounded down so that a free
// space or a margin never reads as more than it is. Every message that names a
// size reads alike, whichever component wrote it.
package bytesize
