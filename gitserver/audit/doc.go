// Package audit is the store of bex's audit trail: one Entry for every change
// made to bex, whichever way it came (ssh commands, git pushes, webhooks, the
// MCP agents' API, the platform's own schedules), appended by the backend and
// listed newest first, a page at a time, with a cursor (Entry.Seq).
//
// The trail lives in files on the gitserver's own volume, the one that also
// holds the repositories, not in the API server: it grows with every change,
// and etcd is the wrong place for an ever-growing log (every object is held by
// the API server and every watcher, and its size is bounded by etcd's quota,
// which the apps' own objects need). Files make the bound ours: entries are
// kept MaxAge (90 days) or MaxEntries (100000), whichever is smaller, and the
// trail goes with the gitserver's data (backed up and restored with the
// repositories it describes).
//
// On disk (Dir, 0700): JSON lines in segment files audit-<Seq of the first
// entry, 20 digits>.jsonl (0600), oldest first by name. Append writes one line
// with a single write on the newest segment, opened O_APPEND; a segment is
// closed after MaxEntries/10 entries or at the first append of a new UTC day,
// and the bound drops whole old segments, so an append costs the same however
// long the trail is. A new segment is made as soon as the last one closes:
// the name of the newest segment remembers the next Seq even when every entry
// has aged out, so Seq keeps increasing across restarts with no other state.
//
// Crashes: a crash of the process loses nothing that Append returned (the line
// is in the kernel's page cache); segments are fsynced once a second when
// written, so a crash of the machine loses at most about the last second. A
// line torn by a crash (no newline, or not JSON) at the end of the newest
// segment is cut off by Open, so the next append starts on a clean line; a bad
// line anywhere else is skipped when read. Dir/lock holds an flock for the
// store's life: a second Store on the same Dir (two processes appending the
// same Seqs) is refused.
//
// Entries hold what users and agents typed (a reason, a commit's message in
// Details): Append replaces control characters (C0, C1, DEL, the Unicode bidi
// controls, line and paragraph separators) and invalid UTF-8, and caps each
// field's length, so that a listing shown in a terminal or handed to an agent
// shows what it says.
package audit
