// Package doccheck holds no code a program uses: its test checks that the repository's
// Markdown (README.md, docs/ and bench/) tells the truth about the repository. Every
// relative link must reach a file (and a heading, when it names one), and every fenced
// shell block may only run Arbiter's commands with subcommands and flags those commands
// have, and name files that exist.
package doccheck
