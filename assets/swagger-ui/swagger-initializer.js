// Starts Swagger UI on sheetd's own document. `validatorUrl: null` turns off the badge that
// would send the document to an outside validator; the base layout needs no standalone preset.
window.onload = function () {
  window.ui = SwaggerUIBundle({
    url: "/api/v1/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    validatorUrl: null,
    persistAuthorization: false,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
};
