// Package releases records the releases of an App and waits for them to serve. A
// release is an immutable Release object ("<app>-v<n>", owned by its App) plus the
// App's spec pointing at it (spec.image, spec.release, spec.processes); both are
// written here so that every cause — a push, a config change, a rollback, a webhook —
// numbers and records its release the same way.
//
// Numbering is optimistic: the next number is the App's spec.release + 1; creating
// the Release claims it (a second writer gets AlreadyExists and retries with the next
// number), and the App is then updated with its resourceVersion as a precondition.
package releases
