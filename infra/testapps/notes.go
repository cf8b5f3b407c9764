package testapps

// NotesScript is the CGI of the notes app: psql (libpq, the real client)
// through DATABASE_URL, the credentials bex's link gives the app. ?write=WORD
// inserts a note; any other request lists them ("notes: a,b").
const NotesScript = `#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
case "$QUERY_STRING" in
write=[a-z]*)
	v=${QUERY_STRING#write=}
	if psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -c "CREATE TABLE IF NOT EXISTS notes (v text); INSERT INTO notes VALUES ('$v')" >/dev/null 2>&1; then
		echo "wrote $v"
	else
		echo "failed to write $v"
	fi ;;
*)
	echo "notes: $(psql "$DATABASE_URL" -X -A -t -c "SELECT coalesce(string_agg(v, ',' ORDER BY v), '') FROM notes" 2>&1)" ;;
esac
`

// NotesDockerfile runs the notes CGI (notes.sh) under busybox's httpd, on the
// Postgres operand image (for its psql), as the operand's postgres user.
func NotesDockerfile(operand string) string {
	return "FROM busybox AS bb\nFROM " + operand + "\nCOPY --from=bb /bin/busybox /bin/busybox\n" +
		"COPY --chmod=755 notes.sh /www/cgi-bin/notes\nUSER 26\n" +
		"CMD [\"/bin/busybox\", \"sh\", \"-c\", \"exec /bin/busybox httpd -f -p \\\"$PORT\\\" -h /www\"]\n"
}
