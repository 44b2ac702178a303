/*
 * energy: joules consumed by the CPU packages, read from RAPL through the powercap interface
 * (/sys/class/powercap/intel-rapl:N/energy_uj; AMD processors expose the same files). Only the top-level
 * package zones are summed (their core/uncore/dram subzones are parts of them, and "psys" overlaps them),
 * so the figure is the CPUs' energy, not the whole machine's. The counters wrap at max_energy_range_uj; a
 * meter read at least once per wrap period (minutes at full power) counts across wraps.
 *
 * Where RAPL is absent or unreadable (containers, virtual machines, the files are root-only since 2020),
 * there is no meter and no invented figure: the caller says so once. The root directory can be moved
 * with $WAFER_POWERCAP_ROOT (tests use a fake tree).
 */
#ifndef WAFER_CORE_ENERGY_H
#define WAFER_CORE_ENERGY_H

struct energy_meter;

/* Opens every readable package zone under root (NULL: $WAFER_POWERCAP_ROOT or /sys/class/powercap).
 * NULL when there is none; then why (128 bytes, may be NULL) says what was found. */
struct energy_meter *energy_meter_create(const char *root, char *why);
void energy_meter_destroy(struct energy_meter *m);

/* Joules consumed since create (monotonic; wraps handled). Not thread-safe: one reader. */
double energy_meter_read(struct energy_meter *m);

/* Package zones summed. */
int energy_meter_zones(const struct energy_meter *m);

#endif
