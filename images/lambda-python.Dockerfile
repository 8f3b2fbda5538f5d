# A stand-in for the Lambda Python 3.13 base image (public.ecr.aws/lambda/python:3.13-<arch>)
# where that image cannot be pulled; images/lambda-python builds it and tags it as the
# image `sam local invoke` asks for. It gives SAM what its "rapid" image build and the
# runtime interface emulator (which SAM adds at /var/rapid) rely on: /var/runtime/bootstrap,
# which the emulator starts when the function is a zip, a Python 3.13 with the runtime
# interface client (awslambdaric) that runs the handler the emulator names in _HANDLER,
# /var/task as the working directory (SAM mounts the code there) and /opt (SAM copies the
# layers there). The build context holds only the awslambdaric wheels (wheels/), which
# images/lambda-python downloads: the build asks no package index.
ARG BASE=seedkeeper/python:3.13-debian13

# Stage 1: /var/lang, the interpreter's prefix in Lambda, as a venv holding awslambdaric;
# pip and the wheels stay in this stage.
FROM ${BASE} AS packages
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /var/lang \
 && /var/lang/bin/pip install --quiet --no-cache-dir --no-index --find-links /tmp/wheels awslambdaric \
 && /var/lang/bin/pip uninstall --quiet --yes pip \
 && /var/lang/bin/python3.13 -m compileall -q /var/lang

FROM ${BASE}
COPY --from=packages /var/lang /var/lang
# The bootstrap: Lambda's module search order (the code, then the layers), then the client.
RUN mkdir -p /var/runtime /var/task /opt \
 && printf '%s\n' \
      '#!/bin/sh' \
      '# Started by the runtime interface emulator, in /var/task, with _HANDLER set.' \
      'export AWS_EXECUTION_ENV=AWS_Lambda_python3.13' \
      'export PYTHONPATH=/opt/python/lib/python3.13/site-packages:/opt/python' \
      'exec /var/lang/bin/python3.13 -m awslambdaric "$_HANDLER"' \
      >/var/runtime/bootstrap \
 && chmod 0755 /var/runtime/bootstrap
# The public image's environment, less what only Amazon Linux has.
ENV LANG=C.UTF-8 \
    TZ=:/etc/localtime \
    PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin \
    LAMBDA_TASK_ROOT=/var/task \
    LAMBDA_RUNTIME_DIR=/var/runtime
LABEL org.opencontainers.image.description="Seedkeeper's stand-in for the Lambda Python 3.13 base image"
WORKDIR /var/task
