// Package dbbackups keeps the dumps of managed Postgres databases on the
// gitserver's disk (postgres:backups:capture, the backups' schedule,
// postgres:restore --backup ID).
//
// Each database's backups live in a directory named after the Database's UID,
// not its name: a database made later under the same name, by anyone, never
// sees an earlier one's dumps. A backup is written to a temporary file in that
// directory, synced and renamed into place, so that a crash, a failed pg_dump
// or a full disk never leaves a file that looks like a backup; the free space
// of the file system is checked while the dump is written, and a dump that
// would take it under the floor is stopped and removed, so a database cannot
// fill the disk the repositories live on.
//
// A backup's name carries everything known about it: its ID (the UTC time it
// was taken, "20261206-231502", with "-2" and on for a second one in the same
// second) and its kind (captured or scheduled): "<id>.<kind>.dump". IDs are
// checked against that pattern before they reach a path.
package dbbackups
