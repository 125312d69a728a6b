// Package erase carries out internal/sanitize's decisions on this host's
// disks: it finds out what each disk can do (sysfs, NVMe Identify, ATA
// IDENTIFY), erases it by the chosen method, reads the result back, and
// returns the evidence. It writes only to the disk it is given, opened
// exclusively, and never to a disk the host booted from or the admin kept.
package erase
