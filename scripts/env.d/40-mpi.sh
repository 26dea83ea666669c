# MPI tests: the binary is built with the `mpi` feature (scripts/test.sh) and Open MPI is installed (setup.d/40-mpi.sh).
export RSERVE_MPI=1
export RSERVE_CARGO_FEATURES="${RSERVE_CARGO_FEATURES:+$RSERVE_CARGO_FEATURES,}rserve-server/mpi"
# Open MPI refuses root without these; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
