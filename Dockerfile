# The control plane (`trainyard serve`, the default command) and the node agent
# (`trainyard agent --runtime docker`, with the engine's socket mounted). Built by
# images/build.sh, which makes the base image (Debian bookworm, python3) when missing and the
# wheelhouse (this project's wheel and its dependencies) on the host: no registry is needed, and
# pip inside the build never reaches one.
ARG BASE=trainyard-base:bookworm

FROM ${BASE} AS build
COPY images/.wheelhouse/trainyard /wheels
RUN python3 -m venv /opt/trainyard \
    && /opt/trainyard/bin/pip install --no-index --no-cache-dir --find-links /wheels trainyard

# Without the wheelhouse and pip's build leftovers: only the installed environment.
FROM ${BASE}
COPY --from=build /opt/trainyard /opt/trainyard
RUN useradd --system --uid 999 --home-dir /var/lib/trainyard --create-home trainyard
ENV PATH=/opt/trainyard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TRAINYARD_HOME=/var/lib/trainyard \
    PYTHONUNBUFFERED=1
USER trainyard
EXPOSE 8080
ENTRYPOINT ["trainyard"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
