package state

import (
	"errors"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// sqliteCode is an error's primary SQLite result code, or -1 when SQLite did not give it.
func sqliteCode(err error) int {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() & 0xff
	}
	return -1
}

// sqliteBusy reports whether another process's lock on the file made a write fail.
func sqliteBusy(err error) bool {
	c := sqliteCode(err)
	return c == sqlite3.SQLITE_BUSY || c == sqlite3.SQLITE_LOCKED
}

// sqliteUnavailable is Unavailable for SQLite's errors. The write that failed changed
// nothing: every write is one transaction.
func sqliteUnavailable(err error) string {
	if sqliteBusy(err) {
		return "the state file is locked by another process (SQLite busy); nothing was written"
	}
	switch sqliteCode(err) {
	case sqlite3.SQLITE_FULL:
		return "the disk holding the state file is full; nothing was written"
	case sqlite3.SQLITE_IOERR:
		return "the state file could not be written (I/O error); nothing was written"
	}
	return ""
}
